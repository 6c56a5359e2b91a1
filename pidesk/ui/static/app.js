// pidesk web client: speaks PROTOCOL.md (plus docs/protocol-notes.md) over one WebSocket.
//
// Nothing lives only in the page: sessions, messages, approvals, permissions, the
// queue and unread marks are read from the host (session.list, session.get paged
// by seq, plans.list, notifications.list) and kept current by its events. A reload
// or a reconnect reads them again. The page keeps only view state (which project
// and session are shown — also in the URL — and the composer's unsent draft).

import { Rpc } from './wire.js';
import { h, clip, explain, hostInfo, sandboxInfo, PERMISSION_LABEL } from './util.js';
import { Transcript } from './transcript.js';
import { createLayout } from './layout.js';
import { createComposer } from './composer.js';
import { createSchedules } from './schedules.js';
import { createChanges } from './changes.js';
import { createContextLine } from './context.js';
import {
  S, addUnread, busy, byUpdated, currentSession, newView, normPath, projectKey, putApproval, putPermission,
  pendingModes, putSession, sessionsIn,
} from './state.js';

performance.mark('pidesk:script');

const $ = (id) => document.getElementById(id);
const PAGE = 200;
const SESSION_PAGE = 100; // sessions read at a time (session.list pages newest first); boot.js asks the same
const UNREAD_PAGE = 1000; // the newest unseen notifications read to mark sessions unread (a page: never the whole table)
const MODES = ['agent', 'plan', 'goal'];
const PERMISSIONS = ['ask', 'accept-edits', 'auto'];

const location_ = new URL(window.location.href);
const token = location_.searchParams.get('token') || '';

const urlProject = location_.searchParams.get('project');
const urlSession = location_.searchParams.get('session');
if (urlProject) S.extraProjects.add(normPath(urlProject));

const el = {
  tabs: $('tabs'), conn: $('conn'), sessions: $('sessions'), head: $('session-head'),
  transcript: $('transcript'), messages: $('messages'), earlier: $('earlier'), empty: $('empty'),
  permissions: $('permissions'), queue: $('queue'), input: $('input'), chip: $('mode-chip'),
  perm: $('perm'), mayDo: $('may-do'), send: $('send'), stop: $('stop'), abort: $('abort'),
  file: $('file'), atts: $('attachments'), newSession: $('new-session'), addProject: $('add-project'),
  addProjectForm: $('add-project-form'), addProjectInput: $('add-project-input'), toasts: $('toasts'),
  addProjectError: $('add-project-error'),
  composer: $('composer'), banner: $('banner'), working: $('working'), workingText: $('working-text'),
  schedulesButton: $('schedules-button'), schedulesDialog: $('schedules-dialog'),
  sidebarToggle: $('sidebar-toggle'), scrim: $('scrim'), toggleUnread: $('toggle-unread'),
  sessionFilter: $('session-filter'), notify: $('notify'), notifyOpt: $('notify-opt'), sandbox: $('sandbox'),
};

const wsUrl = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/rpc?token=${encodeURIComponent(token)}`;
const rpc = new Rpc(wsUrl, { onEvent, onState, probe, initial: initialCalls });

const transcript = new Transcript({ scroller: el.transcript, list: el.messages, earlier: el.earlier }, {
  session: () => currentSession(),
  fork: (messageId) => fork(messageId),
  forkFromApproval: (a, info) => fork(info?.resultMsg?.id || info?.callMsg?.id || null),
  resolvePlan,
  revise: (a) => revisePlan(a),
  approvalDetails,
  upgradeMarkdown: () => scheduleMarkdown(),
});

const {
  stashDraft, unstashDraft, setComposer, autosize, upload, renderComposer, draftKey,
} = createComposer(el, { rpc, toast: (err) => toast(err) });

const {
  renderTabs, renderSidebar, renderHead, renderDock, renderEmpty, renderTitle, renderSandbox,
} = createLayout(el, {
  openSession: (id) => openSession(id),
  selectProject,
  queueAction,
  resolvePermission,
  executionSummary: (a) => transcript.executionSummary(a),
  rename: renameSession,
  deleteSession,
  contextWindow: () => contextLine.window(),
  compact: (id) => compact(id),
  loadOlder: () => loadOlderSessions(),
});

const schedulesPanel = createSchedules(el, { rpc, toast: (what, kind) => toast(what, kind) });
const changesPanel = createChanges({ main: document.querySelector('main.main'), transcript: $('transcript'), list: $('messages'),
  rpc, current: () => S.current, toast: (what, kind) => toast(what, kind) });
const contextLine = createContextLine($('context-line'), rpc, () => S.current, () => renderHead());

// ---- connection ---------------------------------------------------------------------

// A call in flight when the connection drops is rejected with DISCONNECTED: expected, not an
// error — the reconnect re-reads everything from the host. Any other rejection still surfaces.
window.addEventListener('unhandledrejection', (event) => {
  if (event.reason?.code === 'DISCONNECTED') event.preventDefault();
});

function onState(state, detail, initial) {
  S.conn = state;
  renderConn();
  if (state === 'open') {
    hostInfo.strictPlanning = detail?.strictPlanning === true;
    hostInfo.sandbox = detail?.sandbox ?? null;
    renderSandbox();
    changesPanel.reconnected();
    contextLine.reconnected();
    markOnce('pidesk:connected');
    try {
      resync(initial);
    } catch (err) {
      toast(err);
    }
  }
  if (state === 'failed') toast(detail);
}

async function probe() {
  try {
    const res = await fetch('/rpc', {
      method: 'POST', cache: 'no-store',
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${token}` },
      body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'host.status' }),
    });
    return res.status === 401 ? 'unauthorized' : 'ok';
  } catch {
    return 'down';
  }
}

function renderConn() {
  const text = {
    connecting: 'connecting…', open: 'connected', reconnecting: 'reconnecting…', failed: 'host refused the client',
    unauthorized: 'the token was rejected', notoken: 'no token',
  }[S.conn] || S.conn;
  el.conn.className = `conn conn-${S.conn}`;
  el.conn.textContent = text;
  const locked = S.conn === 'unauthorized' || S.conn === 'notoken';
  el.banner.hidden = S.conn === 'open' || S.conn === 'connecting';
  el.banner.classList.toggle('banner-locked', locked);
  el.banner.textContent = {
    notoken: 'This page was opened without the host’s token, so it cannot connect: open the address `pidesk serve` printed (it ends in ?token=…).',
    unauthorized: 'The host refused this page’s token: open the address `pidesk serve` printed this time (it ends in ?token=…).',
  }[S.conn] || 'Lost the connection to the host. Reconnecting… Everything is kept by the host and comes back when it does.';
  if (locked) renderLocked();
  renderComposer();
}

// Without the host's token nothing can be read: say, where the transcript would be, how to get in.
// The token reaches the page only in its address (?token=…, as `pidesk serve` prints it).
function renderLocked() {
  const address = `${location.origin}/?token=…`;
  const refused = S.conn === 'unauthorized';
  el.messages.classList.remove('loading');
  el.empty.hidden = false;
  el.empty.replaceChildren(h('section', { class: 'locked', role: 'region', 'aria-label': 'How to connect' },
    h('h2', null, refused ? 'This is not the host’s token' : 'This page needs the host’s token'),
    h('p', null, 'When it starts, ', h('code', null, 'pidesk serve'), ' prints a line like'),
    h('pre', { class: 'locked-line' }, `pidesk serving at ${address}`),
    h('p', null, 'and opens that address. Open that whole address, ', h('code', null, '?token='), ' and all: the token is what lets a page use this host.'),
    h('ul', { class: 'empty-tips' },
      refused && h('li', null, 'A host started with ', h('code', null, '--new-token'), ' or another ', h('code', null, '--token'),
        ' locks out pages opened with the old one; a token cut short when copying is refused too.'),
      h('li', null, 'Lost the line it printed? The token is kept in the file ', h('code', null, 'token'), ' in pidesk’s data directory (',
        h('code', null, 'host.json'), ' beside it has the address): put it after ', h('code', null, '?token='), ' in this page’s address.'),
      h('li', null, 'A host started with ', h('code', null, '--log-safe'), ' prints the address without its token, for the same reason.'))));
}

// What the page reads first, sent with host.hello in one frame (first load and every reconnect).
let wanted = null;
function initialCalls() {
  S.resyncing = []; // events that arrive before the answers wait for them
  wanted = S.firstLoad ? urlSession : S.current;
  // a reconnect reads again as many sessions as were shown (older pages are not kept apart)
  const limit = S.firstLoad ? SESSION_PAGE : Math.min(1000, Math.max(SESSION_PAGE, S.sessions.size));
  const calls = [['session.list', { limit }], ['notifications.list', { unseenOnly: true, limit: UNREAD_PAGE }]];
  if (wanted) calls.push(...sessionCalls(wanted));
  return calls;
}

// Take everything again from the host: the answers to initialCalls.
function resync(initial) {
  const first = S.firstLoad;
  S.firstLoad = false;
  const [list, notes, ...pre] = initial;
  markOnce('pidesk:snapshot');
  const early = S.resyncing || [];
  S.resyncing = null;
  try {
    takeSnapshot(first, list, notes, pre);
  } finally {
    for (const ev of early) onEvent(ev); // right after the snapshot, before anything newer
  }
}

// Synchronous up to each openSession's first await, so the early events above land on
// the opened view (applied on top of its snapshot, or buffered while it loads).
function takeSnapshot(first, list, notes, pre) {
  if (list instanceof Error) throw list;
  S.sessions = new Map(list.sessions.map((s) => [s.id, s]));
  S.sessionCursor = list.nextCursor ?? null;
  // the session asked for may be older than the first page: its own read brought it
  if (wanted && !S.sessions.has(wanted) && pre[0] && !(pre[0] instanceof Error)) putSession(pre[0].session);
  S.unread = new Map();
  if (!(notes instanceof Error)) for (const n of notes.notifications) addUnread(n);
  const open = (id, options) => openSession(id, options).catch((err) => toast(err));
  if (wanted && S.sessions.has(wanted)) {
    open(wanted, { prefetched: pre, keepComposer: !first });
    return;
  }
  if (first) {
    const project = urlProject ? normPath(urlProject) : null;
    const newest = (project !== null ? sessionsIn(project) : [...S.sessions.values()]).sort(byUpdated)[0];
    if (newest) open(newest.id);
    else newDraft(project ?? S.project ?? '');
    return;
  }
  if (S.current && !S.sessions.has(S.current)) newDraft(S.project ?? '');
  else renderAll();
}

function sessionCalls(id) {
  return [
    ['session.get', { sessionId: id, limit: PAGE }],
    ['plans.list', { sessionId: id }],
    ['session.turns', { sessionId: id, limit: 200 }],
  ];
}

// ---- events ---------------------------------------------------------------------------

function onEvent(ev) {
  if (S.resyncing) {
    S.resyncing.push(ev);
    return;
  }
  schedulesPanel.hostEvent(ev);
  changesPanel.hostEvent(ev);
  contextLine.hostEvent(ev);
  switch (ev.type) {
    case 'session.updated': {
      const known = S.sessions.has(ev.session.id);
      putSession(ev.session);
      if (ev.session.id === S.current) {
        renderWorking();
        renderHead();
        renderComposer();
        renderDock();
        transcript.permissionsChanged();
      }
      renderSidebar();
      if (!known) renderTabs();
      return;
    }
    case 'session.deleted':
      S.sessions.delete(ev.sessionId);
      S.unread.delete(ev.sessionId);
      if (ev.sessionId === S.current) newDraft(S.project ?? '');
      else { renderSidebar(); renderTabs(); }
      return;
    case 'notification.created': {
      const n = ev.notification;
      if (n.sessionId === S.current && document.visibilityState === 'visible') {
        rpc.call('notifications.markSeen', { ids: [n.id] }).catch(() => {});
      } else {
        addUnread(n);
        renderSidebar();
        renderTabs();
        notifyDesktop(n);
      }
      return;
    }
    default: {
      const sid = ev.sessionId || ev.request?.sessionId || ev.approval?.sessionId;
      const view = S.view;
      if (!view || sid !== view.id) return;
      if (view.loading) view.buffer.push(ev);
      else applyViewEvent(view, ev);
    }
  }
}

function applyViewEvent(view, ev) {
  applyOne(view, ev);
  renderWorking();
}

function applyOne(view, ev) {
  if (view.retrying && ev.type !== 'turn.retrying' && ev.turnId === view.retrying.turnId) view.retrying = null;
  switch (ev.type) {
    case 'turn.retrying': // the model request failed and is sent again after a wait: say so, and why
      view.retrying = { turnId: ev.turnId, attempt: ev.attempt, of: ev.of, waitS: ev.waitS, reason: ev.reason };
      break;
    case 'turn.started':
      view.turns.set(ev.turnId, { id: ev.turnId, origin: ev.origin, state: 'running' });
      break;
    case 'message.delta':
      transcript.delta(ev);
      renderEmpty();
      break;
    case 'message.appended':
      transcript.upsert(ev.message);
      renderEmpty();
      break;
    case 'tool.started':
      transcript.toolStarted(ev);
      break;
    case 'tool.finished':
      transcript.toolFinished(ev);
      break;
    case 'permission.requested':
    case 'permission.resolved':
      putPermission(view, ev.request);
      renderDock();
      transcript.permissionsChanged();
      break;
    case 'plan.requested':
    case 'plan.resolved':
      if (!putApproval(view, ev.approval)) break;
      transcript.renderApproval(ev.approval);
      if (ev.type === 'plan.requested' && ev.approval.status === 'pending') transcript.reveal(ev.approval.id);
      renderHead();
      break;
    case 'execution.changed': {
      const a = view.approvals.get(ev.approvalId);
      if (a) {
        const next = { ...a, executionId: ev.executionId, executionState: ev.executionState };
        if (putApproval(view, next)) transcript.renderApproval(next);
      }
      renderHead();
      break;
    }
    case 'queue.changed':
      view.queue = ev.entries;
      renderDock();
      break;
    case 'turn.ended': {
      const t = view.turns.get(ev.turnId) || { id: ev.turnId };
      view.turns.set(ev.turnId, { ...t, state: 'ended', reason: ev.reason, errorCode: ev.errorCode || null,
        errorMessage: ev.errorMessage || null });
      transcript.turnEnded(ev);
      readUsage(view, ev.turnId);
      break;
    }
    default:
  }
}

// A turn's token counts are on its row (session.turns), not in turn.ended: read them once it ends,
// for the dim usage line under its last message.
async function readUsage(view, turnId) {
  let got;
  try {
    got = await rpc.call('session.turns', { sessionId: view.id, limit: 5 });
  } catch {
    return; // the line shows on the next load
  }
  const t = got.turns.find((x) => x.id === turnId);
  if (!t || S.view !== view) return;
  view.turns.set(t.id, { ...view.turns.get(t.id), ...t });
  transcript.usageNote(t);
}

// ---- desktop notifications (opt-in) -------------------------------------------------------
//
// Off until the user ticks the box in the sidebar (and the browser allows it); the choice is
// kept in this browser. Only a turn that finished unseen notifies: not the one on screen.

const NOTIFY_KEY = 'pidesk.notify';

function notifyWanted() {
  return typeof Notification === 'function' && Notification.permission === 'granted' && localStorage.getItem(NOTIFY_KEY) === 'on';
}

function notifyDesktop(n) {
  if (!notifyWanted()) return;
  const s = S.sessions.get(n.sessionId);
  const failed = n.kind === 'task.failed';
  const note = new Notification(`${failed ? 'Turn failed' : 'Turn finished'}: ${s ? s.title : 'a session'}`, {
    body: s?.projectPath ? `in ${s.projectPath}` : 'pidesk', tag: n.id,
  });
  note.onclick = () => {
    window.focus();
    if (S.sessions.has(n.sessionId)) openSession(n.sessionId).catch((err) => toast(err));
    note.close();
  };
}

function renderNotifyOpt() {
  el.notifyOpt.hidden = typeof Notification !== 'function';
  el.notify.checked = notifyWanted();
}

el.notify?.addEventListener('change', async () => {
  if (!el.notify.checked) {
    localStorage.setItem(NOTIFY_KEY, 'off');
    return;
  }
  const answer = Notification.permission === 'granted' ? 'granted' : await Notification.requestPermission();
  if (answer === 'granted') {
    localStorage.setItem(NOTIFY_KEY, 'on');
  } else {
    el.notify.checked = false;
    toast('The browser blocks notifications for this page: allow them in its site settings, then tick the box again.', 'info');
  }
});
renderNotifyOpt();

// ---- opening sessions ------------------------------------------------------------------

async function openSession(id, { prefetched, keepComposer } = {}) {
  const switching = S.current !== id;
  setSidebar(false);
  if (switching && !keepComposer) stashDraft();
  S.current = id;
  const session = S.sessions.get(id);
  if (session) S.project = projectKey(session);
  const view = newView(id);
  S.view = view;
  transcript.reset(view);
  if (switching && !keepComposer) unstashDraft();
  requestAnimationFrame(() => setTimeout(updateUrl, 0)); // history.replaceState is slow-ish: after the paint
  renderAll();
  focusSession(id);
  const [got, plans, turns] = prefetched && prefetched.length ? prefetched : await rpc.batch(sessionCalls(id));
  if (S.view !== view) return;
  if (got instanceof Error) {
    if (got.code === 'NOT_FOUND') {
      S.sessions.delete(id);
      newDraft(S.project ?? '');
    }
    toast(got);
    return;
  }
  putSession(got.session);
  view.queue = got.queue;
  view.hasMore = got.hasMore;
  view.minSeq = got.messages.length ? got.messages[0].seq : null;
  if (!(plans instanceof Error)) for (const a of plans.approvals) putApproval(view, a);
  if (got.pendingApproval) putApproval(view, got.pendingApproval);
  for (const p of got.pendingPermissions) putPermission(view, p);
  if (!(turns instanceof Error)) for (const t of turns.turns) view.turns.set(t.id, t);
  transcript.setMessages(got.messages);
  for (const a of view.approvals.values()) transcript.renderApproval(a);
  if (got.pendingApproval) transcript.reveal(got.pendingApproval.id);
  view.loading = false;
  for (const ev of view.buffer.splice(0)) applyOne(view, ev);
  renderAll();
  markOnce('pidesk:transcript-rendered');
  requestAnimationFrame(() => setTimeout(() => markOnce('pidesk:transcript-painted'), 0));
  await scheduleMarkdown();
  requestAnimationFrame(() => setTimeout(() => {
    markOnce('pidesk:interactive');
    view.ready = true;
    renderEarlier();
  }, 0));
}

// The sidebar's next page of sessions (older ones, by creation), on its button or when scrolled to.
async function loadOlderSessions() {
  const cursor = S.sessionCursor;
  if (!cursor || S.loadingOlder) return;
  S.loadingOlder = true;
  renderSidebar();
  try {
    const page = await rpc.call('session.list', { limit: SESSION_PAGE, cursor });
    if (S.sessionCursor !== cursor) return; // a reconnect read the list again meanwhile
    for (const s of page.sessions) putSession(s);
    S.sessionCursor = page.nextCursor ?? null;
  } catch (err) {
    toast(err);
  } finally {
    S.loadingOlder = false;
    renderSidebar();
    renderTabs();
  }
}

function focusSession(id) {
  if (document.visibilityState !== 'visible') return;
  rpc.call('session.focus', { sessionId: id }).catch(() => {});
  if (S.unread.has(id)) {
    S.unread.delete(id);
    renderSidebar();
    renderTabs();
  }
  rpc.call('notifications.markSeen', { sessionId: id }).catch(() => {});
}

function newDraft(project) {
  setSidebar(false);
  stashDraft();
  S.current = null;
  S.project = project;
  S.view = null;
  transcript.reset(newView(null));
  el.messages.classList.remove('loading');
  unstashDraft();
  updateUrl();
  renderAll();
  rpc.call('session.focus', { sessionId: null }).catch(() => {});
  el.input.focus();
}

async function loadEarlier() {
  const view = S.view;
  if (!view || !view.hasMore || view.loadingEarlier || view.minSeq === null) return;
  view.loadingEarlier = true;
  renderEarlier();
  try {
    const got = await rpc.call('session.get', { sessionId: view.id, beforeSeq: view.minSeq, limit: PAGE });
    if (S.view !== view) return;
    view.hasMore = got.hasMore;
    if (got.messages.length) view.minSeq = got.messages[0].seq;
    transcript.prepend(got.messages);
    scheduleMarkdown();
  } catch (err) {
    toast(err);
  } finally {
    view.loadingEarlier = false;
    renderEarlier();
  }
}

const earlierObserver = new IntersectionObserver((entries) => {
  if (entries.some((e) => e.isIntersecting) && S.view?.ready) loadEarlier();
}, { root: el.transcript, rootMargin: '400px 0px 0px 0px' });
earlierObserver.observe(el.earlier);

function renderEarlier() {
  const view = S.view;
  el.earlier.replaceChildren();
  if (!view || !view.hasMore) return;
  el.earlier.append(h('button', { type: 'button', class: 'link', onclick: loadEarlier, disabled: view.loadingEarlier },
    view.loadingEarlier ? 'Loading earlier messages…' : 'Load earlier messages'));
}

// ---- markdown -----------------------------------------------------------------------

let markdownRun = null;
function scheduleMarkdown() {
  if (!markdownRun) {
    markdownRun = Promise.resolve().then(async () => {
      try {
        for (let round = 0; round < 3; round++) {
          const texts = [...new Set(transcript.pendingMarkdown())];
          if (!texts.length) return;
          const results = await rpc.batch(texts.map((text) => ['markdown.render', { text }]));
          transcript.applyMarkdown(texts.map((t, i) => [t, results[i] instanceof Error ? escapeHtml(t) : results[i].html]));
        }
      } finally {
        markdownRun = null;
      }
    });
  }
  return markdownRun;
}

function escapeHtml(text) {
  const d = document.createElement('div');
  d.textContent = text;
  return `<p class="pre">${d.innerHTML}</p>`;
}

// ---- approvals --------------------------------------------------------------------------

function approvalDetails(a) {
  const have = S.approvalDetails.get(a.id);
  if (have) return have;
  if (!S.approvalCache.has(a.id)) {
    const load = (async () => {
      const ids = a.revises ? [a.id, a.revises] : [a.id];
      const [cur, prev] = await rpc.batch(ids.map((approvalId) => ['plans.get', { approvalId }]));
      const det = cur instanceof Error ? { error: cur.message } : { html: cur.html, markdown: cur.markdown };
      if (a.revises && prev && !(prev instanceof Error)) det.prev = prev.markdown;
      S.approvalDetails.set(a.id, det);
      const latest = S.view?.approvals.get(a.id);
      if (!latest) return;
      transcript.renderApproval(latest); // the transcript keeps a pinned card or its bottom in view as it grows
    })().catch(() => S.approvalCache.delete(a.id));
    S.approvalCache.set(a.id, load);
  }
  return null;
}

// ``context`` (approve only): what the execution sees of the conversation, "keep" | "compact" | "fresh"
async function resolvePlan(a, decision, permissionMode, feedback, context = 'keep') {
  const params = { approvalId: a.id, sessionId: a.sessionId, turnId: a.turnId, decision };
  if (decision === 'approve') {
    params.permissionMode = permissionMode;
    params.context = context;
  }
  if (feedback) params.feedback = feedback;
  try {
    const updated = await rpc.call('plans.resolve', params);
    if (S.view?.id === a.sessionId) {
      if (putApproval(S.view, updated)) transcript.renderApproval(updated);
    }
  } catch (err) {
    toast(err);
  }
}

// "Revise now" on a rejected plan: the feedback turn, sent (or queued) as a person would.
async function revisePlan(a) {
  const s = S.sessions.get(a.sessionId);
  if (!s) return false;
  const kind = a.kind === 'goal' ? 'goal' : 'plan';
  const text = a.feedback ? `Please revise the ${kind} with my feedback: ${a.feedback}` : `Please revise the ${kind}.`;
  try {
    await promptOrQueue(s, { sessionId: s.id, text });
    return true;
  } catch (err) {
    toast(err);
    return false;
  }
}

async function promptOrQueue(s, params) {
  if (busy(s)) {
    await rpc.call('agent.queue.push', params);
    return;
  }
  try {
    await rpc.call('agent.prompt', params);
  } catch (err) {
    if (err.code !== 'AGENT_BUSY') throw err;
    await rpc.call('agent.queue.push', params);
  }
}

async function resolvePermission(req, decision, remember) {
  const params = { requestId: req.id, sessionId: req.sessionId, turnId: req.turnId, decision };
  if (remember) params.remember = remember;
  try {
    await rpc.call('permissions.resolve', params);
    if (S.view) putPermission(S.view, { ...req, status: 'answered' });
    renderDock();
    transcript.permissionsChanged();
  } catch (err) {
    toast(err);
  }
}

// ---- actions ----------------------------------------------------------------------------

// "Compact" in the header: session.compact folds the model's view of the conversation into a
// summary now (the transcript keeps every message; the divider it appends says what happened).
async function compact(id) {
  if (S.compacting.has(id)) return;
  S.compacting.add(id);
  renderHead();
  renderWorking();
  try {
    const res = await rpc.call('session.compact', { sessionId: id });
    if (!res.compacted) toast('Nothing to compact: no conversation since the session started or was last compacted.', 'info');
  } catch (err) {
    toast(err);
  } finally {
    S.compacting.delete(id);
    if (id === S.current) {
      renderHead();
      renderWorking();
      contextLine.refresh();
    }
  }
}

async function send() {
  const text = el.input.value;
  if (!text.trim() || S.uploads) return;
  const attachments = S.attachments.slice();
  let s = currentSession();
  setComposer('', []);
  transcript.followBottom(); // what the prompt starts shows as it comes
  try {
    if (!s) {
      s = await rpc.call('session.create', {
        projectPath: S.project || undefined, title: clip(text, 60),
        mode: S.newSettings.mode, permissionMode: S.newSettings.permissionMode,
      });
      putSession(s);
      S.drafts.delete(draftKey());
      if (S.project && s.projectPath !== S.project) S.extraProjects.delete(S.project); // the host resolved the path
      await openSession(s.id, { keepComposer: true });
    }
    const params = { sessionId: s.id, text };
    if (attachments.length) params.attachments = attachments;
    await promptOrQueue(s, params);
  } catch (err) {
    if (!el.input.value) setComposer(text, attachments);
    toast(err);
  }
}

async function stop() {
  const s = currentSession();
  if (!s) return;
  if (s.planState === 'awaiting_approval') {
    // Stop ends the turn at its next step, and a turn waiting on a plan has none until you
    // decide: say so rather than "stopping…" forever.
    toast(`The ${s.mode === 'goal' ? 'goal' : 'plan'} is still waiting for your decision: Stop takes effect only after you approve or reject it. Abort ends the turn now (the ${s.mode === 'goal' ? 'goal' : 'plan'} becomes interrupted).`,
      'info', { label: 'Abort the turn', run: abort });
    return;
  }
  try {
    await rpc.call('agent.stop', { sessionId: s.id });
    toast('Stopping at the next step…', 'info');
  } catch (err) {
    toast(err);
  }
}

async function abort() {
  const s = currentSession();
  if (!s || !busy(s)) return;
  try {
    const res = await rpc.call('agent.abort', { sessionId: s.id, smart: true });
    if (res.restoredDraft) {
      const d = res.restoredDraft;
      const typed = el.input.value;
      setComposer(typed && typed !== d.text ? `${d.text}\n\n${typed}` : d.text, [...d.attachments, ...(typed ? S.attachments : [])]);
      el.input.focus();
      // the prompt left the transcript with the abort: read the session again
      if (S.current === s.id) await openSession(s.id, { keepComposer: true });
    }
  } catch (err) {
    toast(err);
  }
}

async function renameSession(id, title) {
  try {
    putSession(await rpc.call('session.rename', { sessionId: id, title }));
  } catch (err) {
    toast(err);
  }
  renderSidebar();
  if (id === S.current) { renderHead(); updateUrl(); }
}

// The error, for the menu to show where the user is looking (null once deleted).
async function deleteSession(id) {
  try {
    await rpc.call('session.delete', { sessionId: id });
    return null;
  } catch (err) {
    return err;
  }
}

async function fork(throughMessageId) {
  const s = currentSession();
  if (!s) return;
  try {
    const params = { sessionId: s.id };
    if (throughMessageId) params.throughMessageId = throughMessageId;
    const child = await rpc.call('session.fork', params);
    putSession(child);
    await openSession(child.id);
    toast(`Forked into “${child.title}”.`, 'info');
  } catch (err) {
    toast(err);
  }
}

let modeChain = Promise.resolve();
function cycleMode(step = 1) {
  const s = currentSession();
  const allowed = (s ? s.projectPath : S.project) ? MODES : ['agent'];
  if (!s) {
    const i = allowed.indexOf(S.newSettings.mode);
    S.newSettings.mode = allowed[(i + step + allowed.length) % allowed.length];
    renderComposer();
    return;
  }
  if (busy(s)) {
    toast('The mode can change only while the session is idle.', 'info');
    return;
  }
  if (allowed.length === 1) {
    toast('Plan and Goal need a project folder; this is a scratch session.', 'info');
    return;
  }
  const next = allowed[(allowed.indexOf(s.mode) + step + allowed.length) % allowed.length];
  S.sessions.set(s.id, { ...s, mode: next, planState: next === 'agent' ? 'inactive' : 'planning' }); // shown at once; the host confirms
  const pending = pendingModes.get(s.id) || { mode: next, count: 0 };
  pending.mode = next;
  pending.count += 1;
  pendingModes.set(s.id, pending);
  renderComposer();
  renderHead();
  modeChain = modeChain.then(async () => {
    let confirmed = null;
    let failure = null;
    try {
      confirmed = await rpc.call('session.setMode', { sessionId: s.id, mode: next });
    } catch (err) {
      failure = err;
    } finally {
      pending.count -= 1;
      if (pending.count === 0) pendingModes.delete(s.id);
    }
    if (failure === null) {
      putSession(confirmed);
    } else {
      toast(failure);
      try { putSession((await rpc.call('session.get', { sessionId: s.id, limit: 1 })).session, true); } catch { /* reconnect re-reads */ }
    }
    if (S.current === s.id) { renderComposer(); renderHead(); renderSidebar(); }
  });
}

async function setPermissionMode(value) {
  const s = currentSession();
  if (!s) {
    S.newSettings.permissionMode = value;
    renderComposer();
    return;
  }
  try {
    putSession(await rpc.call('session.setPermissionMode', { sessionId: s.id, permissionMode: value }));
  } catch (err) {
    toast(err);
  }
  renderComposer();
  renderHead();
}

async function queueAction(method, entry) {
  try {
    const res = await rpc.call(method, { sessionId: entry.sessionId, entryId: entry.id });
    if (res?.entries && S.view?.id === entry.sessionId) {
      S.view.queue = res.entries;
      renderDock();
    }
  } catch (err) {
    toast(err);
  }
}

// ---- layout ------------------------------------------------------------------------------------

function selectProject(key) {
  if (key === S.project && S.current) return;
  const newest = sessionsIn(key).sort(byUpdated)[0];
  if (newest) openSession(newest.id);
  else newDraft(key);
}

// A quiet "working" line while the model thinks: not while text streams, a tool runs,
// or the turn waits on the user (a permission or an approval card says so).
function renderWorking() {
  const s = currentSession();
  const compacting = !!s && S.compacting.has(s.id);
  const show = compacting || (!!s && s.status === 'running' && s.planState !== 'awaiting_approval' && !transcript.active());
  const retry = S.view?.id === s?.id ? S.view?.retrying : null;
  el.working.hidden = !show;
  el.workingText.textContent = compacting ? 'Summarising the conversation for the model…'
    : retry ? `Retrying in ${Math.round(retry.waitS)} s (${retry.attempt}/${retry.of}): ${retry.reason}`
      : 'The agent is working…';
  el.workingText.title = retry ? retry.reason : '';
}

function renderAll() {
  renderWorking();
  renderTabs();
  renderSidebar();
  renderHead();
  renderDock();
  renderComposer();
  renderEmpty();
  renderEarlier();
  changesPanel.show();
  contextLine.show();
}

function updateUrl() {
  const u = new URL(window.location.href);
  if (S.project) u.searchParams.set('project', S.project);
  else u.searchParams.delete('project');
  if (S.current) u.searchParams.set('session', S.current);
  else u.searchParams.delete('session');
  if (u.href !== window.location.href) history.replaceState(null, '', u);
  renderTitle();
}

// On a narrow screen the sidebar slides in over the page behind the ☰ button (CSS decides
// when; the class only says whether it is open).
function setSidebar(open) {
  document.body.classList.toggle('sidebar-open', open);
  el.scrim.hidden = !open; // the shade over the page: a tap on it closes the sidebar
  el.sidebarToggle.setAttribute('aria-expanded', open ? 'true' : 'false');
}

// ---- toasts, marks ----------------------------------------------------------------------------

function toast(what, kind = 'error', action = null) {
  const code = what?.code;
  const text = typeof what === 'string' ? what : what?.message || String(what);
  const hint = code ? explain(code) : '';
  const node = h('div', { class: `toast toast-${kind}`, role: kind === 'error' ? 'alert' : 'status' },
    code && h('code', null, code), h('span', null, text), hint && hint !== text && h('span', { class: 'muted' }, hint),
    action && h('button', { type: 'button', class: 'toast-action', onclick: () => { node.remove(); action.run(); } }, action.label));
  el.toasts.append(node);
  setTimeout(() => node.remove(), kind !== 'info' || action ? 8000 : 3500);
}

function markOnce(name) {
  if (!performance.getEntriesByName(name, 'mark').length) performance.mark(name);
}

// ---- wiring -----------------------------------------------------------------------------------

el.input.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  } else if (e.key === 'Tab' && e.shiftKey) {
    e.preventDefault();
    cycleMode();
  }
});
el.input.addEventListener('input', autosize);
el.input.addEventListener('paste', (e) => {
  const files = [...(e.clipboardData?.files || [])];
  if (files.length) {
    e.preventDefault();
    upload(files);
  }
});
el.composer.addEventListener('dragover', (e) => { e.preventDefault(); });
el.composer.addEventListener('drop', (e) => {
  e.preventDefault();
  upload([...(e.dataTransfer?.files || [])]);
});
el.chip.addEventListener('click', () => cycleMode());
el.chip.addEventListener('keydown', (e) => {
  if (e.key === 'Tab' && e.shiftKey) {
    e.preventDefault();
    cycleMode();
  }
});
el.perm.replaceChildren(...PERMISSIONS.map((p) => h('option', { value: p }, PERMISSION_LABEL[p])));
el.perm.addEventListener('change', (e) => setPermissionMode(e.target.value));
el.send.addEventListener('click', send);
el.stop.addEventListener('click', stop);
el.abort.addEventListener('click', abort);
el.file.addEventListener('change', () => {
  upload([...el.file.files]);
  el.file.value = '';
});
el.newSession.addEventListener('click', () => newDraft(S.project ?? ''));
// the badge's tooltip, for a screen without hover
el.sandbox.addEventListener('click', () => { const info = sandboxInfo(hostInfo.sandbox); if (info) toast(info.text, 'info'); });
el.sidebarToggle.addEventListener('click', () => setSidebar(!document.body.classList.contains('sidebar-open')));
el.scrim.addEventListener('click', () => setSidebar(false));
el.addProject.addEventListener('click', () => {
  el.addProjectForm.hidden = !el.addProjectForm.hidden;
  if (!el.addProjectForm.hidden) el.addProjectInput.focus();
});
// Popovers close on a click outside them (what was typed in the project box stays for next time).
document.addEventListener('click', (e) => {
  if (!el.addProjectForm.hidden && !e.target.closest?.('#add-project-form, #add-project')) el.addProjectForm.hidden = true;
});
// "+ Project" asks the host whether the folder can be a project before it becomes a tab:
// a missing folder is refused here, where it was typed, not on the first send.
function projectError(text) {
  el.addProjectError.hidden = !text;
  el.addProjectError.textContent = text || '';
  el.addProjectInput.setAttribute('aria-invalid', text ? 'true' : 'false');
}

el.addProjectForm.addEventListener('submit', async (e) => {
  e.preventDefault();
  const typed = el.addProjectInput.value.trim();
  if (!typed) return;
  if (!typed.startsWith('/')) {
    projectError('Give the project folder as an absolute path, like /home/me/src/app.');
    return;
  }
  let answer;
  try {
    answer = await rpc.call('projects.check', { path: typed });
  } catch (err) {
    projectError(`${err.message}${err.code ? ` (${err.code})` : ''}`);
    return;
  }
  if (el.addProjectInput.value.trim() !== typed) return; // edited meanwhile: the next Enter checks that
  if (!answer.ok) {
    projectError(answer.reason);
    return;
  }
  const path = normPath(answer.path);
  projectError('');
  S.extraProjects.add(path);
  el.addProjectInput.value = '';
  el.addProjectForm.hidden = true;
  selectProject(path);
});
el.addProjectInput.addEventListener('input', () => projectError(''));
document.addEventListener('keydown', (e) => {
  if (e.key !== 'Escape' || e.defaultPrevented) return;
  if (e.target === el.addProjectInput) {
    el.addProjectForm.hidden = true;
    return;
  }
  if (document.body.classList.contains('sidebar-open')) {
    setSidebar(false);
    return;
  }
  if (e.target.closest?.('dialog')) return; // Esc in the schedules dialog closes it, never aborts
  if (e.target.closest?.('.card')) return; // Esc inside a card (its feedback box) never aborts the turn
  if (e.target.closest?.('.sidebar')) return; // nor in the sidebar (a rename, the filter)
  const s = currentSession();
  if (s && s.status !== 'idle') {
    e.preventDefault();
    abort();
  }
});
document.addEventListener('visibilitychange', () => {
  if (S.conn !== 'open') return;
  if (document.visibilityState === 'visible') {
    if (S.current) focusSession(S.current);
  } else {
    rpc.call('session.focus', { sessionId: null }).catch(() => {});
  }
});
setInterval(() => { if (document.visibilityState === 'visible') renderSidebar(); }, 60000); // "n min ago"

if (token) {
  renderConn();
  rpc.connect();
} else {
  S.conn = 'notoken'; // nothing to knock with: say how to get in rather than retry
  renderConn();
}
