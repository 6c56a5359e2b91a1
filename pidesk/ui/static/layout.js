// The frame around the transcript: project tabs, the sessions sidebar, the session
// header (mode, permissions, status, plan and execution state: what the agent may do
// must be impossible to misread), the dock (permission cards, the queue) and the
// empty state. Each render reads the page state and redraws its part whole.

import { h, ago, basename, clip, hostInfo, mayDo, sandboxInfo, MODE_LABEL } from './util.js';
import { permissionCard, executionBadge } from './transcript.js';
import { S, busy, currentSession, projects, sessionsIn, statusOf } from './state.js';

const FILTER_FROM = 8; // sessions in a project before the sidebar offers a filter box
const SHARED_START = 16; // characters two titles may share before the sidebar shows where they differ

// ``act``: {openSession, selectProject, queueAction, resolvePermission, executionSummary, rename, deleteSession,
//          contextWindow, compact, loadOlder}
export function createLayout(el, act) {
  function renderTabs() {
    const tabs = projects().map((key) => {
      const unread = sessionsIn(key).filter((s) => S.unread.has(s.id)).length;
      const active = key === S.project;
      return h('button', {
        type: 'button', role: 'tab', class: `tab${active ? ' active' : ''}`, 'aria-selected': active ? 'true' : 'false',
        title: key || 'sessions without a project folder', dataset: { project: key },
        onclick: () => act.selectProject(key),
      }, h('span', { class: 'tab-name' }, key ? basename(key) : 'Scratch'), unread ? h('span', { class: 'tab-unread', 'aria-label': `${unread} unread` }, String(unread)) : null);
    });
    el.tabs.replaceChildren(...tabs);
    showActiveTab();
    const unread = [...S.unread.keys()].filter((id) => S.sessions.has(id)).length;
    el.toggleUnread.hidden = !unread;
    el.toggleUnread.textContent = unread ? String(unread) : '';
    renderTitle();
  }

  // The project tabs scroll sideways when they do not fit (a phone): keep the shown project's in view.
  function showActiveTab() {
    const tab = el.tabs.querySelector('.tab.active');
    if (!tab) return;
    const bar = el.tabs.getBoundingClientRect();
    const box = tab.getBoundingClientRect();
    const room = 4; // px kept beside it, so a fraction of a pixel never cuts it
    if (box.left < bar.left + room) el.tabs.scrollLeft -= Math.ceil(bar.left + room - box.left);
    else if (box.right > bar.right - room) el.tabs.scrollLeft += Math.ceil(Math.min(box.right - bar.right + room, box.left - bar.left - room));
  }

  // The tab's title counts the turns that finished unseen: "(2) pidesk".
  function renderTitle() {
    let count = 0;
    for (const [id, ids] of S.unread) if (S.sessions.has(id)) count += ids.size;
    const s = currentSession();
    const base = s ? `${s.title} · pidesk` : 'pidesk';
    document.title = count ? `(${count}) ${base}` : base;
  }

  // The session menu (⋯ on each item): rename in place, delete after a confirmation. One menu
  // at a time; an item being renamed keeps its input across re-renders.
  const menu = { id: null, confirm: false, error: null, renaming: null, input: null, rendering: false };

  function closeMenu() {
    if (menu.id === null && menu.renaming === null) return;
    menu.id = null;
    menu.confirm = false;
    menu.error = null;
    renderSidebar();
  }

  document.addEventListener('click', (e) => {
    if (menu.id !== null && !e.target.closest?.('.session-menu, .session-more')) closeMenu();
  });

  function startRename(s) {
    menu.id = null;
    menu.renaming = s.id;
    const input = h('input', {
      class: 'rename-input', type: 'text', maxlength: '200', 'aria-label': 'Session title', spellcheck: 'false',
    });
    input.value = s.title;
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      menu.renaming = null;
      menu.input = null;
      renderSidebar();
      if (save && title && title !== s.title) await act.rename(s.id, title);
    };
    input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') { e.preventDefault(); finish(true); }
      else if (e.key === 'Escape') { e.preventDefault(); finish(false); }
    });
    input.addEventListener('blur', () => { if (!menu.rendering) finish(true); }); // a re-render moves it: not a blur
    menu.input = input;
    renderSidebar();
    input.focus();
    input.select();
  }

  async function confirmDelete(s) {
    const error = await act.deleteSession(s.id);
    if (!error) {
      closeMenu();
      return;
    }
    menu.error = error.code === 'AGENT_BUSY'
      ? `“${s.title}” is busy (a turn is running, a plan awaits approval, or an execution is queued). Abort it or let it finish, then delete it.`
      : `${error.message}${error.code ? ` (${error.code})` : ''}`;
    renderSidebar();
  }

  function sessionMenu(s) {
    if (menu.confirm) {
      return h('div', { class: 'session-menu confirm', role: 'dialog', 'aria-label': `Delete ${s.title}` },
        h('p', null, 'Delete ', h('strong', null, `“${s.title}”`), '? Its transcript, plans and queue are removed; the project’s files stay.'),
        menu.error && h('p', { class: 'menu-error', role: 'alert' }, menu.error),
        h('div', { class: 'menu-actions' },
          h('button', { type: 'button', class: 'danger confirm-delete', onclick: () => confirmDelete(s) }, 'Delete'),
          h('button', { type: 'button', onclick: closeMenu }, 'Cancel')));
    }
    return h('div', { class: 'session-menu', role: 'menu', 'aria-label': `Actions for ${s.title}` },
      h('button', { type: 'button', role: 'menuitem', onclick: () => startRename(s) }, 'Rename'),
      h('button', { type: 'button', role: 'menuitem', class: 'danger', onclick: () => { menu.confirm = true; menu.error = null; renderSidebar(); } }, 'Delete…'));
  }

  // A title cut to the sidebar's width must still tell its session from the others: where two
  // titles share a long start, the part where they differ is kept in view and the shared start
  // is what gets cut ("Refactor the…on submit"); a title no different from another's gets the
  // session's start time and the tail of its id beside it.
  function titleView(title, like) {
    if (!like || like.same || like.from <= 0) return h('span', { class: 'session-title' }, title);
    return h('span', { class: 'session-title split' },
      h('span', { class: 'title-head' }, title.slice(0, like.from)), h('span', { class: 'title-tail' }, title.slice(like.from)));
  }

  function matches(s) {
    const q = el.sessionFilter.value.trim().toLowerCase();
    return !q || s.title.toLowerCase().includes(q) || s.id === menu.renaming;
  }

  function renderSidebar() {
    const keep = !!menu.input && document.activeElement === menu.input;
    menu.rendering = true;
    try {
      drawSidebar();
    } finally {
      menu.rendering = false;
    }
    if (keep && menu.input) menu.input.focus();
  }

  function drawSidebar() {
    const all = sessionsIn(S.project ?? '');
    const filtering = all.length >= FILTER_FROM || !!el.sessionFilter.value;
    el.sessionFilter.hidden = !filtering;
    const shown = filtering ? all.filter(matches) : all;
    const alike = lookalikes(shown);
    const items = shown.map((s) => {
      const [cls, label] = statusOf(s);
      const unread = S.unread.has(s.id);
      const active = s.id === S.current;
      const like = alike.get(s.id);
      if (menu.renaming === s.id && menu.input) {
        return h('li', { class: 'session-li renaming' }, h('div', { class: `session-item${active ? ' active' : ''}`, dataset: { session: s.id } },
          h('span', { class: `dot status-${cls}`, 'aria-hidden': 'true' }), h('span', { class: 'session-main' }, menu.input)));
      }
      const open = menu.id === s.id;
      return h('li', { class: `session-li${open ? ' menu-open' : ''}` }, h('button', {
        type: 'button', class: `session-item${active ? ' active' : ''}${unread ? ' unread' : ''}`,
        dataset: { session: s.id, status: cls }, 'aria-current': active ? 'true' : null,
        onclick: () => { if (s.id !== S.current) act.openSession(s.id); },
        title: like?.same ? `${s.title}\nstarted ${startedAt(s.createdAt)} · ${s.id}` : s.title, // all of it, on hover
      },
      h('span', { class: `dot status-${cls}`, 'aria-hidden': 'true' }),
      h('span', { class: 'session-main' },
        h('span', { class: 'session-top' }, titleView(s.title, like)),
        h('span', { class: 'session-sub' },
          h('span', { class: `mini-mode mode-${s.mode}` }, MODE_LABEL[s.mode]),
          h('span', { class: `session-status status-${cls}` }, label),
          like?.same
            ? h('span', { class: 'session-time session-started', title: `started ${startedAt(s.createdAt)}; session id ${s.id}` },
              `${startedAt(s.createdAt)} · ${s.id.slice(-6)}`)
            : h('span', { class: 'session-time', title: `last active ${s.updatedAt}` }, ago(s.updatedAt)))),
      unread && h('span', { class: 'unread-mark', title: 'finished while you were away', 'aria-label': 'unread' })),
      h('button', {
        type: 'button', class: 'session-more', title: 'Rename or delete', 'aria-label': `More for ${s.title}`,
        'aria-haspopup': 'menu', 'aria-expanded': open ? 'true' : 'false',
        onclick: () => { menu.id = open ? null : s.id; menu.confirm = false; menu.error = null; renderSidebar(); },
      }, '⋯'),
      open && sessionMenu(s));
    });
    if (filtering && !shown.length) items.push(h('li', { class: 'muted filter-empty' }, `No session matches “${el.sessionFilter.value.trim()}”.`));
    if (S.sessionCursor) {
      items.push(h('li', { class: 'older' }, h('button', {
        type: 'button', class: 'link load-older', disabled: S.loadingOlder, onclick: () => act.loadOlder(),
        title: filtering ? 'The filter looks only at the sessions read so far' : null,
      }, S.loadingOlder ? 'Loading older sessions…' : 'Show older sessions')));
    }
    if (S.current === null) {
      items.unshift(h('li', null, h('div', { class: 'session-item active draft' }, h('span', { class: 'dot status-idle' }),
        h('span', { class: 'session-main' }, h('span', { class: 'session-title' }, 'New session'), h('span', { class: 'session-sub' }, 'type below to start')))));
    }
    el.sessions.replaceChildren(...items);
  }

  // id -> {same: true} (another shown session has this very title) or {from} (where the part that
  // tells it apart starts: the word in which it leaves the longest start it shares with another title).
  function lookalikes(sessions) {
    const sorted = sessions.map((s) => [s.title, s.id]).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    const out = new Map();
    sorted.forEach(([title, id], i) => {
      const before = i > 0 ? sorted[i - 1][0] : '';
      const after = i + 1 < sorted.length ? sorted[i + 1][0] : '';
      const shared = Math.max(common(title, before), common(title, after)); // the most alike title sorts beside it
      if ((i > 0 && before === title) || (i + 1 < sorted.length && after === title)) {
        out.set(id, { same: true });
      } else if (shared >= SHARED_START) {
        const space = title.lastIndexOf(' ', Math.min(shared, title.length - 1));
        out.set(id, { same: false, from: space > 0 ? space + 1 : shared });
      }
    });
    return out;
  }

  function common(a, b) {
    let n = 0;
    while (n < a.length && n < b.length && a[n] === b[n]) n++;
    return n;
  }

  // "14:05" today, "2026-12-06 14:05" before
  function startedAt(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return '';
    const time = `${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}`;
    return new Date().toDateString() === d.toDateString() ? time : `${iso.slice(0, 10)} ${time}`;
  }

  // Scrolling the list down to its end reads the next page by itself.
  el.sessions.addEventListener('scroll', () => {
    const list = el.sessions;
    if (S.sessionCursor && list.scrollHeight - list.scrollTop - list.clientHeight < 200) act.loadOlder();
  }, { passive: true });

  el.sessionFilter.addEventListener('input', () => renderSidebar());
  el.sessionFilter.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && el.sessionFilter.value) {
      e.preventDefault();
      el.sessionFilter.value = '';
      renderSidebar();
    }
  });

  // Which sandbox Bash runs in, from host.hello: calm when on, loud when off or broken.
  function renderSandbox() {
    const info = sandboxInfo(hostInfo.sandbox);
    el.sandbox.hidden = !info;
    if (!info) return;
    el.sandbox.className = `sandbox-badge sandbox-${info.level}`;
    el.sandbox.dataset.level = info.level;
    el.sandbox.dataset.short = info.short;
    el.sandbox.title = info.text;
    el.sandbox.replaceChildren(h('span', { class: 'sandbox-mark', 'aria-hidden': 'true' }), h('span', { class: 'sandbox-label' }, info.label));
  }

  function renderHead() {
    const s = currentSession();
    if (!s) {
      el.head.replaceChildren(h('div', { class: 'title-row' }, h('h1', null, 'New session'),
        h('span', { class: 'muted' }, S.project ? S.project : 'scratch — no project folder')));
      return;
    }
    const [cls, label] = statusOf(s);
    const exec = headExecution(s);
    const badges = [
      h('span', { class: `badge mode-badge mode-${s.mode}`, title: 'mode' }, `${MODE_LABEL[s.mode]} mode`),
      h('span', { class: `badge perm-badge perm-${s.permissionMode}`, title: mayDo(s.mode, s.permissionMode).text }, `permissions: ${s.permissionMode}`),
    ];
    // the plan state says "awaiting approval" itself; the status badge would only repeat it
    if (cls !== 'awaiting') badges.push(h('span', { class: `badge status-badge status-${cls}` }, label));
    if (s.mode !== 'agent' || s.planState !== 'inactive') {
      badges.push(h('span', { class: `badge plan-badge plan-${s.planState}`, title: 'plan state' }, s.planState === 'awaiting_approval' ? 'awaiting approval' : 'planning'));
    }
    if (exec) badges.push(executionBadge(exec, act.executionSummary(exec), 'exec-badge '));
    const forked = s.forkedFrom && S.sessions.get(s.forkedFrom.sessionId);
    const u = s.usage;
    const usage = u && (u.inputTokens || u.outputTokens)
      ? h('span', { class: 'usage muted', title: usageTitle(u) }, `${tokens(u.inputTokens)} in · ${tokens(u.outputTokens)} out`)
      : null;
    el.head.replaceChildren(
      h('div', { class: 'title-row' },
        h('h1', { title: s.id }, s.title),
        h('span', { class: 'muted path', title: s.root }, s.projectPath || 'scratch'),
        forked && h('button', { type: 'button', class: 'link', onclick: () => act.openSession(forked.id) }, `forked from “${forked.title}”`)),
      h('div', { class: 'badges' }, badges, h('span', { class: 'head-end' }, usage, contextMeter(s))),
    );
  }

  // The execution the header speaks of: the newest contract's, while it is queued or running, and
  // after it ended only until a new plan or goal starts (then "execution completed" would be stale).
  function headExecution(s) {
    let newest = null;
    for (const a of S.view?.approvals.values() || []) if (!newest || a.createdAt >= newest.createdAt) newest = a;
    if (!newest?.executionId || newest.executionState === 'none') return null;
    const live = newest.executionState === 'queued' || newest.executionState === 'running';
    return live || s.planState === 'inactive' ? newest : null;
  }

  function usageTitle(u) {
    const n = (v) => (v || 0).toLocaleString();
    const cache = u.cacheTokens ? `; of the input, ${n(u.cacheReadTokens)} read from the prompt cache and ${n(u.cacheWriteTokens)} written to it` : '';
    return `tokens used by this session: ${n(u.inputTokens)} input, ${n(u.outputTokens)} output${cache}`;
  }

  // How full the model's context window is (session.context's ``window``, issue 30), and the
  // button that compacts it now. Amber past 85 %: the host compacts by itself about there.
  function contextMeter(s) {
    const w = act.contextWindow();
    if (!w) return null;
    const share = w.usedTokens / w.limitTokens;
    const pct = Math.round(share * 100);
    const times = w.compactions === 1 ? 'once' : `${w.compactions} times`;
    const title = `The model's context window: ${w.usedTokens.toLocaleString()} of ${w.limitTokens.toLocaleString()} tokens `
      + `in use (the last request's input, or an estimate of the next).\n`
      + (w.compactions ? `Compacted ${times} so far.` : 'Not compacted yet.')
      + ' Past about 85 % the host summarises the older conversation by itself.';
    const meter = h('span', { class: `context-meter${share > 0.85 ? ' meter-high' : ''}`, title, role: 'meter',
      'aria-label': 'context window used', 'aria-valuemin': '0', 'aria-valuemax': String(w.limitTokens),
      'aria-valuenow': String(Math.min(w.usedTokens, w.limitTokens)), dataset: { compactions: String(w.compactions) } },
    h('span', { class: 'meter-bar', 'aria-hidden': 'true' }, h('span', { class: 'meter-fill', style: `width: ${Math.min(pct, 100)}%` })),
    `context ${pct}% · ${tokens(w.usedTokens)} / ${tokens(w.limitTokens)}`);
    const compacting = S.compacting.has(s.id);
    const blocked = busy(s) && !compacting;
    const button = h('button', {
      type: 'button', class: 'compact-now', disabled: compacting || blocked, onclick: () => act.compact(s.id),
      title: compacting ? 'Summarising the conversation…'
        : blocked ? 'The session is busy: compact it once the turn has ended (or the plan is decided).'
          : 'Summarise the conversation so far for the model, freeing its context window. The transcript here stays whole.',
    }, compacting ? 'Compacting…' : 'Compact');
    return [meter, button];
  }

  function tokens(n) {
    return n >= 1000 ? `${(n / 1000).toFixed(n >= 10000 ? 0 : 1)}k` : String(n);
  }

  function renderDock() {
    const view = S.view;
    const s = currentSession();
    const perms = view ? [...view.permissions.values()].filter((p) => p.status === 'pending') : [];
    el.permissions.replaceChildren(...perms.map((p) => permissionCard(p, s, { resolvePermission: act.resolvePermission })));
    const entries = view ? view.queue : [];
    if (!entries.length) {
      el.queue.replaceChildren();
      el.queue.hidden = true;
      return;
    }
    el.queue.hidden = false;
    // An idle session with a queue is holding it (after an abort, or a restart): nothing runs
    // until the user says so.
    const held = !!s && !busy(s);
    el.queue.classList.toggle('held', held);
    el.queue.replaceChildren(
      h('div', { class: 'queue-head' }, h('strong', null, `Queued prompts (${entries.length})`),
        held
          ? [h('span', { class: 'queue-held' }, 'Held — nothing runs until you resume'),
            h('button', { type: 'button', class: 'primary q-resume', title: 'Run the first queued prompt now; the rest follow in order', onclick: () => act.queueAction('agent.queue.sendNow', entries[0]) }, 'Resume')]
          : h('span', { class: 'muted' }, 'they run in order when the current turn ends')),
      h('ol', { class: 'queue-list' }, entries.map((e, i) => h('li', { class: 'queue-entry', dataset: { entry: e.id } },
        h('span', { class: 'queue-text', title: e.text }, clip(e.text, 140)),
        e.attachments?.length ? h('span', { class: 'muted' }, ` +${e.attachments.length} file(s)`) : null,
        h('span', { class: 'queue-actions' },
          i > 0 && h('button', { type: 'button', class: 'q-top', onclick: () => act.queueAction('agent.queue.prioritize', e) }, 'Move to top'),
          h('button', { type: 'button', class: 'q-now', title: 'Stop the current turn at its next step and run this next', onclick: () => act.queueAction('agent.queue.sendNow', e) }, 'Send now'),
          h('button', { type: 'button', class: 'q-remove', onclick: () => act.queueAction('agent.queue.remove', e) }, 'Remove'))))));
  }

  function renderEmpty() {
    const s = currentSession();
    const empty = !el.messages.children.length && !el.messages.classList.contains('loading');
    el.empty.hidden = !empty;
    if (!empty) return;
    const where = s ? (s.projectPath || 'a scratch folder') : (S.project || 'a scratch folder');
    el.empty.replaceChildren(
      h('h2', null, s ? 'Nothing here yet' : 'Start a session'),
      h('p', null, 'The agent works in ', h('code', null, where), '.'),
      h('ul', { class: 'empty-tips' },
        h('li', null, h('strong', null, 'Agent'), ' — does the work, asking as your permission setting says.'),
        h('li', null, h('strong', null, 'Plan'), ' — investigates, then proposes a plan for you to approve before anything is written.'),
        h('li', null, h('strong', null, 'Goal'), ' — like Plan, with acceptance criteria the execution must prove.')),
      h('p', { class: 'muted' }, 'Pick the mode with the chip left of the input (or Shift+Tab).'));
  }


  window.addEventListener('resize', showActiveTab);

  return { renderTabs, renderSidebar, renderHead, renderDock, renderEmpty, renderTitle, renderSandbox };
}
