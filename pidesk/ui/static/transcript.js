// The transcript of the open session: messages in seq order, tool rows, approval cards, turn notes.
//
// Everything shown comes from the host: a page of messages from session.get, then
// events (message.delta / message.appended / tool.* / plan.* / turn.ended). Tool
// rows pair a toolCall block with its toolResult (matched by id); a result whose
// call lies in an older, unloaded page shows on its own until that page loads.
// Assistant text is shown as plain text at once and swapped for the host's
// rendered Markdown (markdown.render, batched) when it arrives. A compaction (the
// host's message holding one ``compaction`` block, issue 30) is a folded divider:
// where the model's view starts again, its summary inside.

import { h, duration, shortArgs, explain, bytes, mayDo, PERMISSION_LABEL } from './util.js';
import { lineDiff, renderDiff, diffStats } from './diff.js';

const OUTPUT_SHOWN = 20000;
const FOLLOW_SLACK = 16; // px from the bottom that still counts as at the bottom
const USER_CLAMP_CHARS = 700;
const USER_CLAMP_LINES = 12;
const APPROVAL_STATUS = {
  pending: 'awaiting approval', approved: 'approved', rejected: 'rejected', expired: 'expired', interrupted: 'interrupted',
};
// What the execution of an approved contract sees of the conversation (plans.resolve ``context``).
const CONTEXT_CHOICES = [
  ['keep', 'Keep the conversation', 'The execution sees the whole planning conversation.'],
  ['compact', 'Compact it first', 'The planning conversation is summarised before the execution starts: less context, the gist kept.'],
  ['fresh', 'Start fresh', 'The execution starts at the approved contract alone; the planning conversation stays here for you, not for the model.'],
];
const CONTEXT_OUTCOME = { compact: ', after compacting the conversation', fresh: ', starting from a fresh context' };
const EXECUTION_TEXT = {
  queued: 'execution queued', running: 'execution running', completed: 'execution completed',
  failed: 'execution failed', aborted: 'execution aborted', interrupted: 'execution interrupted',
};

export class Transcript {
  constructor({ scroller, list, earlier }, actions) {
    this.scroller = scroller;
    this.list = list;
    this.earlier = earlier;
    this.actions = actions;
    this.mdCache = new Map();
    this.view = null;
    this.follow = true;
    this.pin = null;
    this._sets = []; // the scrollTops this page set whose scroll events may not have come yet
    this._last = { top: 0, height: 0 }; // scrollTop and scrollHeight when last seen
    scroller.addEventListener('scroll', () => this._scrolled(), { passive: true });
    const observer = new ResizeObserver(() => this._keep()); // text, cards, Markdown, the dock: any change of size
    observer.observe(scroller);
    for (const child of scroller.children) observer.observe(child);
  }

  reset(view) {
    this.view = view;
    this.els = new Map(); // message id -> element
    this.tools = new Map(); // tool call id -> {call, result, callMsg, resultMsg, row, approxMs, liveMs, running}
    this.cards = new Map(); // approval id -> element
    this.cardUi = new Map(); // approval id -> {perm, feedback, diffOpen}
    this.execTurns = new Map(); // approval id -> id of its execution turn, once seen
    this.streams = new Map(); // message id -> {el, text}
    this.turnLast = new Map(); // turn id -> seq of its last shown message
    this.lastMsg = null;
    this.follow = true;
    this.pin = null;
    this.list.replaceChildren();
    this.list.classList.add('loading');
    this.earlier.replaceChildren();
  }

  // ---- whole pages ----------------------------------------------------------------

  setMessages(messages) {
    const frag = document.createDocumentFragment();
    this._collect(messages);
    for (const m of messages) {
      const el = this._render(m);
      if (el) frag.append(el);
    }
    this.list.append(frag);
    this.list.classList.remove('loading');
    this._notesFromTurns();
    this.scrollToBottom();
  }

  prepend(messages) {
    const before = this.scroller.scrollHeight;
    const top = this.scroller.scrollTop;
    this._collect(messages);
    const frag = document.createDocumentFragment();
    for (const m of messages) {
      if (this.els.has(m.id)) continue;
      const el = this._render(m);
      if (el) frag.append(el);
    }
    this.list.prepend(frag);
    this._notesFromTurns();
    for (const a of this.view.approvals.values()) if (!this.cards.has(a.id)) this.renderApproval(a);
    this._setTop(top + (this.scroller.scrollHeight - before));
  }

  // Index tool calls/results and approximate durations before any row is built.
  _collect(messages) {
    let prev = null;
    for (const m of messages) {
      for (const b of m.content) {
        if (b.type === 'toolCall') {
          const info = this._tool(b.id);
          info.call = b;
          info.callMsg = m;
        } else if (b.type === 'toolResult') {
          const info = this._tool(b.toolCallId);
          info.result = b;
          info.resultMsg = m;
          if (prev && info.approxMs === undefined) {
            const ms = Date.parse(m.createdAt) - Date.parse(prev.createdAt);
            if (ms >= 0) info.approxMs = ms;
          }
        }
      }
      prev = m;
    }
  }

  _tool(id) {
    let info = this.tools.get(id);
    if (!info) {
      info = {};
      this.tools.set(id, info);
    }
    return info;
  }

  // ---- live events ----------------------------------------------------------------

  delta(ev) {
    if (this.els.has(ev.messageId)) return; // already final
    let stream = this.streams.get(ev.messageId);
    if (!stream) {
      const text = document.createTextNode('');
      const body = h('div', { class: 'md plain' }, text);
      const el = h('article', { class: 'msg msg-assistant streaming', dataset: { id: ev.messageId, turn: ev.turnId, seq: 'Infinity' } },
        h('div', { class: 'msg-who' }, 'Agent'),
        h('div', { class: 'msg-body' }, body, h('span', { class: 'caret', 'aria-hidden': 'true' })));
      stream = { el, text };
      this.streams.set(ev.messageId, stream);
      this.list.append(el);
    }
    stream.text.appendData(ev.text);
    this._keep();
  }

  upsert(m) {
    if (this.els.has(m.id)) return;
    this._collect(this.lastMsg ? [this.lastMsg, m] : [m]);
    const el = this._render(m);
    const stream = this.streams.get(m.id);
    if (stream) {
      this.streams.delete(m.id);
      if (el) stream.el.replaceWith(el);
      else stream.el.remove();
    } else if (el) {
      this._insert(el, m.seq);
    }
    // a turn's last words can land after its end (an abort keeps the partial answer): its note follows them
    const note = m.turnId && this.list.querySelector(`.turn-note[data-turn="${CSS.escape(m.turnId)}"]`);
    if (note && Number(note.dataset.seq) < m.seq) {
      note.dataset.seq = String(m.seq + 0.5);
      note.remove();
      this._insert(note, m.seq + 0.5);
    }
    this._keep();
    this.actions.upgradeMarkdown();
  }

  toolStarted(ev) {
    const info = this._tool(ev.toolCallId);
    info.running = true;
    info.startedAt = performance.now();
    this._refreshRow(ev.toolCallId);
  }

  toolFinished(ev) {
    const info = this._tool(ev.toolCallId);
    info.running = false;
    info.liveMs = ev.durationMs;
    if (!info.result) info.finished = { ok: ev.ok, errorCode: ev.errorCode || null };
    this._refreshRow(ev.toolCallId);
  }

  permissionsChanged() {
    for (const [id, info] of this.tools) if (info.row) this._refreshRow(id);
  }

  turnEnded(ev) {
    for (const [id, stream] of this.streams) {
      if (stream.el.dataset.turn === ev.turnId) {
        stream.el.classList.remove('streaming');
        stream.el.querySelector('.caret')?.remove();
        this.streams.delete(id);
      }
    }
    for (const [id, info] of this.tools) {
      if (info.running && info.callMsg?.turnId === ev.turnId) {
        info.running = false;
        this._refreshRow(id);
      }
    }
    this._note(ev.turnId, ev.reason, ev.errorCode, ev.errorMessage);
  }

  // Text is streaming or a tool is running: the transcript itself shows the agent at work.
  active() {
    if (this.streams.size) return true;
    for (const info of this.tools.values()) if (info.running) return true;
    return false;
  }

  // ---- rendering ------------------------------------------------------------------

  _render(m) {
    if (m.role === 'tool') {
      // Results update their call's row; a result whose call is not loaded stands alone.
      let orphan = null;
      for (const b of m.content) {
        if (b.type !== 'toolResult') continue;
        const info = this._tool(b.toolCallId);
        if (info.row) this._refreshRow(b.toolCallId);
        else if (!info.call) orphan = orphan || this._article(m, 'msg-tool', 'Tool', []);
        if (orphan && !info.call) {
          info.orphan = orphan;
          orphan.querySelector('.msg-body').append(this._row(b.toolCallId));
        }
      }
      if (orphan) {
        this.els.set(m.id, orphan);
        orphan._message = m;
      }
      this._track(m);
      return orphan;
    }
    const compaction = m.content.find((b) => b.type === 'compaction');
    if (compaction) return this._compaction(m, compaction);
    const parts = [];
    const turn = this.view.turns.get(m.turnId);
    if (m.role === 'user') {
      const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
      // a host-authored execution prompt repeats the approved contract: show its head only
      const long = turn?.origin === 'execution' || text.length > USER_CLAMP_CHARS || text.split('\n').length > USER_CLAMP_LINES;
      const body = h('div', { class: `user-text${long ? ' clamped' : ''}` }, text);
      parts.push(body);
      if (long) {
        parts.push(h('button', {
          class: 'link more', type: 'button',
          onclick: (e) => { body.classList.toggle('clamped'); e.target.textContent = body.classList.contains('clamped') ? 'Show all' : 'Show less'; },
        }, 'Show all'));
      }
      const atts = m.content.filter((b) => b.type === 'attachment');
      if (atts.length) parts.push(h('div', { class: 'att-list' }, atts.map((a) => h('span', { class: 'att', title: `${a.mime}, ${bytes(a.size)}` }, a.kind === 'image' ? '🖼 ' : '📄 ', a.name))));
    } else {
      for (const b of m.content) {
        if (b.type === 'text') {
          if (b.text) parts.push(this._markdown(b.text));
        } else if (b.type === 'thinking') {
          // the model's reasoning, collapsed (issue 16 §2); a redacted block has no text to show
          parts.push(b.redacted || !b.text
            ? h('div', { class: 'thinking muted small' }, 'Thinking (redacted by the provider)')
            : h('details', { class: 'thinking muted small' }, h('summary', null, 'Thinking'),
              h('div', { class: 'thinking-text', style: 'white-space: pre-wrap' }, b.text)));
        } else if (b.type === 'toolCall') {
          const info = this._tool(b.id);
          if (info.orphan) { // its result showed alone until this older page arrived
            info.orphan.remove();
            this.els.delete(info.resultMsg?.id);
            info.orphan = null;
          }
          parts.push(this._row(b.id));
        }
      }
      if (!parts.length) return this._track(m) && null;
    }
    const who = m.role === 'user' ? userLabel(turn?.origin) : 'Agent';
    const el = this._article(m, m.role === 'user' ? `msg-user${turn?.origin === 'execution' ? ' msg-host' : ''}` : 'msg-assistant', who, parts);
    this.els.set(m.id, el);
    el._message = m;
    this._track(m);
    // approval cards follow the row of the call that submitted them
    for (const b of m.content) {
      if (b.type !== 'toolCall') continue;
      for (const a of this.view.approvals.values()) if (a.toolCallId === b.id) this._placeCard(a, el);
    }
    return el;
  }

  // Where the model's view starts again: a divider that unfolds to the summary the model now
  // sees in place of everything above it (the transcript keeps it all).
  _compaction(m, b) {
    const n = (v) => (v || 0).toLocaleString();
    const fresh = b.reason === 'fresh';
    const label = fresh ? 'Execution started with a fresh context' : `Context compacted (${b.reason})`;
    const figures = b.tokensBefore ? ` · ${n(b.tokensBefore)} → ${n(b.tokensAfter)} tokens` : '';
    const execution = this.view.turns.get(m.turnId)?.origin === 'execution';
    const why = {
      auto: 'The model’s context window was filling up, so the host had the conversation above summarised.',
      manual: execution ? 'The planning conversation above was summarised before the execution, as chosen at approval.'
        : 'The conversation above was summarised on request.',
      fresh: 'The execution was approved with a fresh context: the model sees the approved contract, not the conversation above.',
    }[b.reason] || '';
    const kept = fresh || b.keptFromSeq === null || b.keptFromSeq === undefined ? ''
      : execution ? ' The execution’s instructions stay in view word for word.' : ' The latest request stays in view word for word.';
    const body = [h('p', { class: 'compaction-why muted small' }, why, fresh ? '' : ' The model sees this summary instead of it.', kept)];
    if (b.summary) body.push(h('div', { class: 'compaction-summary' }, this._markdown(b.summary)));
    const el = h('details', { class: `compaction compaction-${b.reason}`, dataset: { id: m.id, seq: String(m.seq), turn: m.turnId || '' } },
      h('summary', null, h('span', { class: 'compaction-label' }, label, figures)),
      body);
    this.els.set(m.id, el);
    el._message = m;
    this._track(m);
    return el;
  }

  _track(m) {
    if (!this.lastMsg || this.lastMsg.seq < m.seq) this.lastMsg = m;
    if (m.turnId && (this.turnLast.get(m.turnId) ?? -1) < m.seq) this.turnLast.set(m.turnId, m.seq);
    return true;
  }

  _article(m, cls, who, parts) {
    const canFork = m.role !== 'tool';
    return h('article', { class: `msg ${cls}`, dataset: { id: m.id, seq: String(m.seq), turn: m.turnId || '' } },
      h('div', { class: 'msg-who' }, who),
      h('div', { class: 'msg-body' }, parts),
      canFork && h('div', { class: 'msg-actions' },
        h('button', {
          class: 'fork', type: 'button', title: 'Start a new session with the conversation up to this message',
          onclick: () => this.actions.fork(this._forkPoint(m)),
        }, 'Fork from here')));
  }

  // Forking from an assistant message keeps the results of its tool calls when they are known.
  _forkPoint(m) {
    let through = m;
    for (const b of m.content) {
      if (b.type !== 'toolCall') continue;
      const r = this.tools.get(b.id)?.resultMsg;
      if (r && r.seq > through.seq) through = r;
    }
    return through.id;
  }

  _insert(el, seq) {
    let node = this.list.lastElementChild;
    while (node && Number(node.dataset.seq) > seq) node = node.previousElementSibling;
    if (node) node.after(el);
    else this.list.prepend(el);
  }

  _markdown(text) {
    const html = this.mdCache.get(text);
    if (html !== undefined) {
      const el = h('div', { class: 'md' });
      setHtml(el, html);
      return el;
    }
    const el = h('div', { class: 'md plain', dataset: { pending: '1' } }, text);
    el._source = text;
    return el;
  }

  // The texts still shown plain; ``apply`` swaps in rendered HTML.
  pendingMarkdown() {
    return [...this.list.querySelectorAll('.md[data-pending]')].map((el) => el._source).filter((t) => t !== undefined && !this.mdCache.has(t));
  }

  applyMarkdown(rendered) {
    for (const [text, html] of rendered) this.mdCache.set(text, html);
    for (const el of this.list.querySelectorAll('.md[data-pending]')) {
      const html = this.mdCache.get(el._source);
      if (html === undefined) continue;
      setHtml(el, html);
      el.classList.remove('plain');
      delete el.dataset.pending;
    }
  }

  // ---- tool rows ------------------------------------------------------------------

  _row(callId) {
    const info = this._tool(callId);
    const call = info.call;
    const result = info.result;
    const name = call?.name || result?.name || 'tool';
    const finished = result || info.finished;
    const waiting = [...this.view.permissions.values()].some((p) => p.toolCallId === callId && p.status === 'pending');
    let state = 'none';
    if (finished) state = finished.ok ? 'ok' : 'error';
    else if (waiting) state = 'waiting';
    else if (info.running || (call && this._turnRunning(info.callMsg?.turnId))) state = 'running';
    const code = finished?.errorCode;
    // one source of truth: the host's measure (tool.finished, kept in the result block as durationMs);
    // only a result stored without one falls back to the gap between message times (marked ≈)
    const measured = result?.durationMs ?? info.liveMs;
    const ms = measured ?? info.approxMs;
    const statusText = { ok: 'done', error: 'failed', waiting: 'waiting for your permission', running: 'running', none: 'no result' }[state];
    const summary = h('summary', null,
      h('span', { class: 'tool-state', title: statusText, 'aria-label': statusText }),
      h('span', { class: 'tool-name' }, name),
      h('code', { class: 'tool-args' }, call ? shortArgs(name, call.args) : ''),
      code && h('span', { class: 'tool-code' }, code),
      name === 'Bash' && call?.args?.escalate === true && h('span', { class: 'tool-outside', title: 'asked to run outside the sandbox' }, 'outside sandbox'),
      state === 'waiting' && h('span', { class: 'tool-wait' }, 'waiting for your permission'),
      h('span', { class: 'tool-dur', title: measured === undefined && ms !== undefined ? 'approximate, from message times' : 'duration' },
        ms !== undefined && finished ? `${measured === undefined ? '≈' : ''}${duration(ms)}` : ''));
    const detail = h('div', { class: 'tool-detail' });
    if (call) detail.append(...argumentsView(name, call.args));
    if (result) {
      const out = result.output || '';
      detail.append(h('div', { class: 'tool-label' }, result.ok ? 'Output' : 'Result'),
        h('pre', { class: 'tool-out' }, out.length > OUTPUT_SHOWN ? `${out.slice(0, OUTPUT_SHOWN)}\n… ${out.length - OUTPUT_SHOWN} more characters` : out || '(empty)'));
    }
    const details = h('details', { class: 'tool-details' }, summary, detail);
    const row = h('div', { class: `tool tool-${state}`, dataset: { call: callId, name } }, details);
    if (code) row.append(h('p', { class: 'tool-explain' }, explain(code) || code));
    if (name === 'ReportCriteria' && Array.isArray(call?.args?.results)) {
      row.append(h('ul', { class: 'criteria-report' }, call.args.results.map((r) => h('li', { class: `crit-${r.outcome}` },
        h('span', { class: `crit-badge crit-${r.outcome}` }, r.outcome), h('span', { class: 'crit-name' }, r.criterion),
        r.evidence && h('span', { class: 'crit-evidence' }, ` — ${r.evidence}`)))));
    }
    info.row = row;
    return row;
  }

  _refreshRow(callId) {
    const info = this.tools.get(callId);
    if (!info?.row) return;
    const old = info.row;
    const open = old.querySelector('details')?.open;
    const row = this._row(callId);
    if (open) row.querySelector('details').open = true;
    old.replaceWith(row);
  }

  _turnRunning(turnId) {
    const s = this.actions.session();
    return !!turnId && s?.currentTurnId === turnId && s.status !== 'idle';
  }

  // ---- turn notes -----------------------------------------------------------------

  _notesFromTurns() {
    for (const t of this.view.turns.values()) {
      if (t.state === 'ended' && t.reason !== 'completed') this._note(t.id, t.reason, t.errorCode, t.errorMessage);
      if (t.state === 'ended') this._usageNote(t);
    }
  }

  // A turn's tokens, cache reads and writes apart (issue 16 §3), under its last message.
  usageNote(t) {
    this._usageNote(t);
  }

  _usageNote(t) {
    const u = t.usage;
    if (!u || !(u.inputTokens || u.outputTokens || u.cacheTokens)) return;
    if (this.list.querySelector(`.turn-usage[data-turn="${CSS.escape(t.id)}"]`)) return;
    const seq = this.turnLast.get(t.id);
    if (seq === undefined) return;
    const n = (v) => (v || 0).toLocaleString();
    const cached = [u.cacheReadTokens && `${n(u.cacheReadTokens)} read`, u.cacheWriteTokens && `${n(u.cacheWriteTokens)} written`];
    const cache = u.cacheTokens ? ` · cache ${cached.filter(Boolean).join(', ') || n(u.cacheTokens)}` : '';
    const el = h('div', { class: 'turn-usage muted small', dataset: { turn: t.id, seq: String(seq + 0.4) },
      title: 'tokens this turn used (input excludes what the prompt cache served, for Anthropic)' },
    `${n(u.inputTokens)} in · ${n(u.outputTokens)} out${cache}`);
    this._insert(el, seq + 0.4);
  }

  // message: the turn's errorMessage (the provider's words, the retries spent), shown under the code
  _note(turnId, reason, code, message) {
    if (reason === 'completed' || !turnId) return;
    if (this.list.querySelector(`.turn-note[data-turn="${CSS.escape(turnId)}"]`)) return;
    const seq = this.turnLast.get(turnId);
    if (seq === undefined) return;
    const label = reason === 'aborted' ? 'Turn aborted' : 'Turn failed';
    const el = h('div', { class: `turn-note note-${reason}`, dataset: { turn: turnId, seq: String(seq + 0.5) }, role: 'note' },
      h('strong', null, label), code && h('code', null, code), code && explain(code) && h('span', null, explain(code)),
      message && h('div', { class: 'turn-note-message' }, message));
    this._insert(el, seq + 0.5);
  }

  // ---- approval cards ---------------------------------------------------------------

  renderApproval(a) {
    if (a.revises && !this.cards.has(a.id)) {
      const prev = this.view.approvals.get(a.revises);
      if (prev && this.cards.has(prev.id)) queueMicrotask(() => this.renderApproval(this.view.approvals.get(prev.id) || prev));
    }
    const old = this.cards.get(a.id);
    if (old) {
      const fresh = this._card(a);
      old.replaceWith(fresh);
      this.cards.set(a.id, fresh);
      return;
    }
    const msg = this.tools.get(a.toolCallId)?.callMsg;
    const host = msg && this.els.get(msg.id);
    if (host) this._placeCard(a, host);
    else if (a.status === 'pending') {
      const wrap = h('div', { class: 'msg msg-card', dataset: { seq: 'Infinity' } }, this._card(a));
      this.list.append(wrap);
      this.cards.set(a.id, wrap.firstChild);
    }
  }

  _placeCard(a, host) {
    if (this.cards.has(a.id)) return;
    const card = this._card(a);
    const row = host.querySelector(`.tool[data-call="${CSS.escape(a.toolCallId)}"]`);
    if (row) row.after(card);
    else host.querySelector('.msg-body').append(card);
    this.cards.set(a.id, card);
  }

  _card(a) {
    const ui = this.cardUi.get(a.id) || { perm: 'ask', context: 'keep', feedback: '', diffOpen: true };
    this.cardUi.set(a.id, ui);
    const det = this.actions.approvalDetails(a);
    const kind = a.kind === 'goal' ? 'Goal' : 'Plan';
    const pending = a.status === 'pending';
    const head = h('header', { class: 'card-head' },
      h('span', { class: `kind kind-${a.kind}` }, kind),
      h('h3', { class: 'card-title' }, a.title),
      h('span', { class: `badge approval-${a.status}` }, APPROVAL_STATUS[a.status] || a.status),
      a.executionId && a.executionState !== 'none' && executionBadge(a, this.executionSummary(a)));
    const meta = h('div', { class: 'artifact' },
      h('span', { class: 'artifact-path', title: 'the contract file, inside the project' }, h('code', null, a.artifactPath)),
      h('span', { class: 'artifact-hash', title: `sha256 ${a.artifactSha256}` }, 'sha256 ', h('code', { class: 'sha' }, a.artifactSha256.slice(0, 12))),
      h('span', { class: 'artifact-size' }, bytes(a.artifactSize)),
      a.revises && h('span', { class: 'artifact-rev' }, 'revision'));
    const parts = [head, h('p', { class: 'question' }, a.question), meta];
    if (a.kind === 'goal' && a.criteria?.length) {
      parts.push(h('div', { class: 'criteria' }, h('h4', null, 'Acceptance criteria'), h('ol', null, a.criteria.map((c) => h('li', null, c)))));
    }
    const body = h('div', { class: 'md card-md' });
    if (det?.html !== undefined) setHtml(body, det.html);
    else body.append(h('p', { class: 'muted' }, det?.error ? `Could not load the ${kind.toLowerCase()}: ${det.error}` : `Loading the ${kind.toLowerCase()}…`));
    if (pending) parts.push(body);
    else parts.push(h('details', { class: 'card-body' }, h('summary', null, `Show the ${kind.toLowerCase()}`), body));
    if (a.revises && det?.prev !== undefined) {
      const ops = lineDiff(det.prev, det.markdown);
      const { added, removed } = diffStats(ops);
      if (!added && !removed) {
        // the agent resubmitted the same text: say so, not "+0 −0" over an empty diff
        parts.push(h('p', { class: 'card-diff card-same muted' }, `No changes since the previous revision: the agent resubmitted the same ${kind.toLowerCase()}.`));
      } else {
        const d = h('details', { class: 'card-diff', ontoggle: (e) => { ui.diffOpen = e.target.open; } },
          h('summary', null, 'Changes since the previous revision ', h('span', { class: 'diff-add-n' }, `+${added}`), ' ', h('span', { class: 'diff-del-n' }, `−${removed}`)),
          renderDiff(ops));
        d.open = pending && ui.diffOpen;
        parts.push(d);
      }
    }
    const summary = this.executionSummary(a);
    if (summary && (summary.denied.length || summary.failed.length)) parts.push(this._summaryList(summary));
    if (pending) parts.push(this._decide(a, ui));
    else if (a.status === 'approved') {
      parts.push(h('p', { class: 'card-outcome' }, `Approved. The execution runs in Agent mode with permissions `,
        h('strong', null, PERMISSION_LABEL[a.permissionMode] || a.permissionMode), CONTEXT_OUTCOME[a.context] || '', '.'));
    } else if (a.status === 'rejected') {
      parts.push(h('p', { class: 'card-outcome' }, 'Rejected.', a.feedback ? ' Your feedback:' : ' No feedback given.'));
      if (a.feedback) parts.push(h('blockquote', { class: 'feedback-quote' }, a.feedback));
      parts.push(this._revise(a, ui));
    } else {
      const why = a.status === 'expired' ? explain('PLAN_APPROVAL_TIMEOUT') : explain('PLAN_APPROVAL_INTERRUPTED');
      parts.push(h('div', { class: 'card-outcome card-stale' }, h('p', null, why),
        h('button', { type: 'button', class: 'fork-approval', onclick: () => this.actions.forkFromApproval(a, this.tools.get(a.toolCallId)) }, 'Fork from here')));
    }
    const execTurn = (a.executionId && this._executionTurn(a)) || ''; // changes.js says what the execution changed
    return h('section', { class: `card approval approval-${a.status}`, dataset: { approval: a.id, execTurn }, 'aria-label': `${kind}: ${a.title}` }, parts);
  }

  // What the execution of an approval did not get to do: its denied and failed tool calls.
  // The execution turn is the one whose host-authored prompt names this artifact and hash.
  executionSummary(a) {
    if (!a.executionId || a.executionState === 'none') return null;
    const turnId = this._executionTurn(a);
    if (!turnId) return null;
    const denied = [];
    const failed = [];
    for (const info of this.tools.values()) {
      const result = info.result;
      if (!result || result.ok || (info.resultMsg?.turnId ?? info.callMsg?.turnId) !== turnId) continue;
      (result.errorCode === 'TOOL_DENIED' ? denied : failed).push(info);
    }
    return { turnId, denied, failed };
  }

  _executionTurn(a) {
    const known = this.execTurns?.get(a.id);
    if (known) return known;
    const mark = `${a.artifactPath} (sha256 ${a.artifactSha256})`;
    for (const el of this.els.values()) {
      const m = el._message;
      if (m?.role !== 'user' || !m.turnId || this.view.turns.get(m.turnId)?.origin !== 'execution') continue;
      if (m.content.some((b) => b.type === 'text' && b.text.includes(mark))) {
        this.execTurns.set(a.id, m.turnId);
        return m.turnId;
      }
    }
    return null;
  }

  _summaryList({ denied, failed }) {
    const item = (info, verb) => {
      const call = info.call || {};
      const name = call.name || info.result.name;
      const code = info.result.errorCode;
      return h('li', { class: `exec-${verb}` }, h('strong', null, verb === 'denied' ? 'Denied' : 'Failed'), ' ',
        h('span', { class: 'tool-name' }, name), ' ', h('code', null, shortArgs(name, call.args)),
        verb === 'failed' && code && h('code', { class: 'tool-code' }, code));
    };
    return h('div', { class: 'exec-summary' },
      h('p', null, 'Not everything in the plan was done:'),
      h('ul', null, denied.map((i) => item(i, 'denied')), failed.map((i) => item(i, 'failed'))));
  }

  // After a rejection the agent sees the feedback in its next turn: say so, and offer to start
  // that turn now — until a revision arrives.
  _revise(a, ui) {
    const revised = [...this.view.approvals.values()].some((x) => x.revises === a.id);
    if (revised) return h('p', { class: 'card-outcome muted revise-note' }, `The agent revised this ${a.kind} below.`);
    if (ui.revising) return h('p', { class: 'card-outcome revise-note' }, `Sent: the agent is revising the ${a.kind}.`);
    const button = h('button', { type: 'button', class: 'primary revise-now' }, 'Revise now');
    button.addEventListener('click', async () => {
      button.disabled = true;
      if (await this.actions.revise(a)) {
        ui.revising = true;
        this.renderApproval(a);
      } else {
        button.disabled = false;
      }
    });
    return h('div', { class: 'card-outcome revise' },
      h('span', null, `The agent revises the ${a.kind} with your feedback in its next turn: `), button,
      h('span', { class: 'muted' }, ' or write to it below.'));
  }

  _decide(a, ui) {
    const copy = h('p', { class: 'may-do' });
    const showCopy = () => {
      const m = mayDo('agent', ui.perm);
      copy.className = `may-do level-${m.level}`;
      copy.textContent = `After approval: ${m.text}`;
    };
    showCopy();
    const select = h('select', {
      class: 'approve-perm', 'aria-label': 'permission mode for the execution',
      onchange: (e) => { ui.perm = e.target.value; showCopy(); },
    }, ['ask', 'accept-edits', 'auto'].map((p) => h('option', { value: p }, `${PERMISSION_LABEL[p]}${p === 'ask' ? ' (default)' : ''}`)));
    select.value = ui.perm;
    const contextHint = h('span', { class: 'context-hint muted small' });
    const showContextHint = () => { contextHint.textContent = CONTEXT_CHOICES.find(([v]) => v === ui.context)[2]; };
    showContextHint();
    const contextSelect = h('select', {
      class: 'approve-context', 'aria-label': 'context for the execution',
      onchange: (e) => { ui.context = e.target.value; showContextHint(); },
    }, CONTEXT_CHOICES.map(([value, label]) => h('option', { value }, `${label}${value === 'keep' ? ' (default)' : ''}`)));
    contextSelect.value = ui.context;
    const feedback = h('textarea', {
      class: 'feedback', rows: '2', placeholder: 'Feedback for the agent (optional, sent with Reject)',
      oninput: (e) => { ui.feedback = e.target.value; },
    });
    feedback.value = ui.feedback;
    const busy = (btn, fn) => async () => {
      btn.disabled = true;
      try { await fn(); } finally { btn.disabled = false; }
    };
    const approve = h('button', { type: 'button', class: 'primary approve' }, 'Approve');
    approve.addEventListener('click', busy(approve, () => this.actions.resolvePlan(a, 'approve', ui.perm, null, ui.context)));
    const reject = h('button', { type: 'button', class: 'reject' }, 'Reject');
    reject.addEventListener('click', busy(reject, () => this.actions.resolvePlan(a, 'reject', null, ui.feedback.trim() || null)));
    const deadline = new Date(a.deadline);
    // the actions are the card's own child, so they can stick to the bottom edge while any of the card shows
    return [
      h('div', { class: 'decide' },
        h('label', { class: 'decide-perm' }, h('span', null, 'Run it with permissions'), select),
        copy,
        h('label', { class: 'decide-perm decide-context' }, h('span', null, 'Context for the execution'), contextSelect, contextHint),
        feedback),
      h('div', { class: 'decide-actions' }, approve, reject,
        !Number.isNaN(deadline.getTime()) && h('span', { class: 'deadline muted' }, `decide by ${deadline.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })}`)),
    ];
  }

  // ---- scrolling ------------------------------------------------------------------
  //
  // The transcript follows its bottom while the reader is there: new text, a finished tool
  // row, a card's plan arriving or Markdown swapped in all keep the newest line in view. A
  // reader who scrolls up stops the following (nothing moves under them) until they scroll
  // back to the bottom. A card that asks for a decision is "pinned": shown with its top in
  // view (its Approve/Reject bar sticks to the bottom edge) until the reader scrolls or it
  // is decided. Scrolls the page makes itself are told apart by the position they set; the
  // browser's own move the view only as the content above it grows (scroll anchoring) or as it
  // shrinks (anchoring, or the end coming up): a move against that is the reader's.

  _scrolled() {
    const top = this.scroller.scrollTop;
    const height = this.scroller.scrollHeight;
    const ours = this._sets.some((v) => Math.abs(top - v) <= 1);
    if (ours && Math.abs(top - this._sets[this._sets.length - 1]) <= 1) this._sets = []; // the last one has come
    if (!ours) {
      const up = top < this._last.top - 1 && height >= this._last.height - 1;
      const down = top > this._last.top + 1 && height <= this._last.height + 1;
      if (up || down) this.pin = null;
      if (up) this.follow = false;
    }
    if (this._distance() <= FOLLOW_SLACK && !this.pin) this.follow = true; // at the bottom, whoever brought it there
    this._seen();
  }

  _seen() {
    this._last = { top: this.scroller.scrollTop, height: this.scroller.scrollHeight };
  }

  _distance() {
    const s = this.scroller;
    return s.scrollHeight - s.scrollTop - s.clientHeight;
  }

  _setTop(value) {
    const before = this.scroller.scrollTop;
    this.scroller.scrollTop = value;
    const now = this.scroller.scrollTop;
    if (now !== before) this._sets = [...this._sets.slice(-7), now]; // (no move, no scroll event: nothing to tell apart)
    this._seen();
  }

  // Something changed size: keep the pinned card, or the bottom, where the reader sees it.
  _keep() {
    if (this.pin) this._showCard(this.pin);
    else if (this.follow) this._setTop(this.scroller.scrollHeight);
    else this._seen();
  }

  // A card that asks for a decision: pin it in view (a new one, or the one waiting when a session opens).
  reveal(approvalId) {
    if (!this.cards.get(approvalId)) return;
    this.pin = approvalId;
    this._showCard(approvalId);
  }

  // Its bottom at the bottom edge when it all fits, else its top at the top edge.
  _showCard(approvalId) {
    const card = this.cards.get(approvalId);
    if (!card || !card.isConnected || !card.classList.contains('approval-pending')) {
      this.pin = null;
      this.follow = true;
      this._setTop(this.scroller.scrollHeight);
      return;
    }
    const view = this.scroller.getBoundingClientRect();
    const box = card.getBoundingClientRect();
    const margin = 12;
    const shift = box.height + 2 * margin > view.height ? box.top - view.top - margin : box.bottom - view.bottom + margin;
    this._setTop(this.scroller.scrollTop + shift);
    this.follow = this._distance() <= FOLLOW_SLACK;
  }

  // Follow the bottom again (the reader sent a prompt): from now on new content stays in view.
  followBottom() {
    this.pin = null;
    this.follow = true;
    this.scrollToBottom();
  }

  // Off-screen messages are laid out lazily (content-visibility), so the first jump lands on
  // estimated heights: jump again once the frame has laid out what is now on screen.
  scrollToBottom() {
    this.pin = null;
    this.follow = true;
    this._setTop(this.scroller.scrollHeight);
    if (this._again) return;
    this._again = requestAnimationFrame(() => {
      this._again = null;
      this._keep();
    });
  }
}

// "execution completed" only when nothing was denied or failed; else it says how many were.
export function executionText(a, summary) {
  const base = EXECUTION_TEXT[a.executionState] || `execution ${a.executionState}`;
  const denied = summary?.denied.length || 0;
  const failed = summary?.failed.length || 0;
  if (!denied && !failed) return base;
  const calls = (n) => (n === 1 ? 'call' : 'calls');
  if (denied && failed) return `${base} with ${denied} denied and ${failed} failed ${calls(denied + failed)}`;
  return denied ? `${base} with ${denied} denied ${calls(denied)}` : `${base} with ${failed} failed ${calls(failed)}`;
}

export function executionBadge(a, summary, extra = '') {
  const text = executionText(a, summary);
  const partial = a.executionState === 'completed' && text !== EXECUTION_TEXT.completed;
  return h('span', { class: `badge ${extra}exec-${partial ? 'partial' : a.executionState}` }, text);
}

// A tool call's arguments as a person reads them: a file's content and an edit's texts as
// text (not JSON with \n escapes), a command as a command; anything else as JSON.
function argumentsView(name, args) {
  const a = args && typeof args === 'object' ? args : {};
  const label = (text) => h('div', { class: 'tool-label' }, text);
  const text = (cls, value) => h('pre', { class: cls }, clipText(value, OUTPUT_SHOWN));
  if (name === 'Write' && typeof a.path === 'string' && typeof a.content === 'string') {
    return [label('File'), h('pre', { class: 'tool-path' }, a.path), label(`Content (${a.content.split('\n').length} lines)`), text('tool-content', a.content || '(empty)')];
  }
  if (name === 'Edit' && typeof a.path === 'string' && typeof a.oldText === 'string' && typeof a.newText === 'string') {
    return [label('File'), h('pre', { class: 'tool-path' }, a.path), label(a.replaceAll ? 'Replace every' : 'Replace'),
      text('tool-old', a.oldText), label('With'), text('tool-new', a.newText)];
  }
  if (name === 'Bash' && typeof a.command === 'string' && a.escalate === true) {
    return [label('Command, outside the sandbox'), text('tool-command', a.command),
      label('The agent’s reason'), h('pre', { class: 'tool-why' }, justification(a) ?? '(no reason given)')];
  }
  if (name === 'Bash' && typeof a.command === 'string') return [label('Command'), text('tool-command', a.command)];
  return [label('Arguments'), h('pre', { class: 'tool-fullargs' }, JSON.stringify(args, null, 2))];
}

// Cut a long text without touching its lines (``clip`` makes one line of it).
function clipText(value, n) {
  const t = String(value ?? '');
  return t.length > n ? `${t.slice(0, n)}\n… ${t.length - n} more characters` : t;
}

function userLabel(origin) {
  if (origin === 'execution') return 'Host · execution';
  if (origin === 'queued') return 'You · queued';
  if (origin === 'scheduled') return 'Schedule';
  return 'You';
}

// HTML from the host's renderer (markdown.render / plans.get): CommonMark with raw HTML
// shown as text and only safe link schemes. Links open outside the page, without a referrer.
export function setHtml(el, html) {
  el.innerHTML = html;
  for (const a of el.querySelectorAll('a[href]')) {
    a.target = '_blank';
    a.rel = 'noopener noreferrer';
  }
}

// The host's preview of a Write/Edit (PermissionRequest.preview.diff), one coloured line per line.
function unifiedDiff(diff) {
  const lines = clipText(diff, 8000).split('\n');
  return h('div', { class: 'diff perm-diff' }, lines.map((line) => {
    const cls = line.startsWith('+') && !line.startsWith('+++') ? 'diff-add'
      : line.startsWith('-') && !line.startsWith('---') ? 'diff-del' : 'diff-ctx';
    return h('div', { class: `diff-line ${cls}` }, h('span', { class: 'diff-text' }, line || ' '));
  }));
}

// The model's reason for leaving the sandbox, as text (never HTML: the model wrote it).
function justification(args) {
  const why = typeof args.justification === 'string' ? args.justification.trim() : '';
  return why ? clipText(why, 2000) : null;
}

// A permission card for the dock: tool, arguments, and the three answers. An escalated
// Bash call (PermissionRequest.escalated: one command outside the sandbox) gets its own
// red card that leads with the question and the model's reason.
export function permissionCard(req, session, actions) {
  const contract = session && session.mode !== 'agent';
  const args = req.args || {};
  const escalated = req.escalated === true;
  let shown;
  if (escalated) {
    const why = justification(args);
    shown = [
      h('p', { class: 'perm-warn' }, 'The agent asks to run this ', h('strong', { class: 'perm-tool' }, req.tool),
        ' command without the sandbox: it would have your full power — every file you can touch, the network, the host’s token.'),
      h('div', { class: 'perm-why-label' }, 'The agent’s reason'),
      h('blockquote', { class: `perm-why${why ? '' : ' perm-why-none'}` }, why ?? '(no reason given)'),
      h('pre', { class: 'perm-args perm-command' }, h('span', { class: 'prompt-sign' }, '$ '), args.command ?? ''),
      Number.isFinite(args.timeoutMs) && h('p', { class: 'muted small perm-timeout' }, `time limit ${duration(args.timeoutMs)}`),
    ];
  } else if (req.tool === 'Bash') shown = h('pre', { class: 'perm-args' }, h('span', { class: 'prompt-sign' }, '$ '), args.command ?? '');
  else if (req.preview?.diff) shown = [h('div', { class: 'perm-path' }, h('code', null, args.path), req.preview.overwrites && h('span', { class: 'perm-overwrites' }, ' overwrites the file')), unifiedDiff(req.preview.diff)];
  else if (req.tool === 'Write') shown = [h('div', { class: 'perm-path' }, h('code', null, args.path)), h('pre', { class: 'perm-args perm-content' }, clipText(args.content ?? '', 4000))];
  else if (req.tool === 'Edit') {
    shown = [h('div', { class: 'perm-path' }, h('code', null, args.path)),
      h('pre', { class: 'perm-args perm-edit' }, clipText(args.oldText ?? '', 2000).split('\n').map((l) => `− ${l}\n`).join(''),
        clipText(args.newText ?? '', 2000).split('\n').map((l) => `+ ${l}\n`).join(''))];
  }
  else shown = h('pre', { class: 'perm-args' }, JSON.stringify(args, null, 2));
  const answer = (decision, remember) => async (e) => {
    const buttons = e.target.closest('.perm-actions').querySelectorAll('button');
    buttons.forEach((b) => { b.disabled = true; });
    try { await actions.resolvePermission(req, decision, remember); } finally { buttons.forEach((b) => { b.disabled = false; }); }
  };
  const head = escalated
    ? h('header', { class: 'perm-head' }, h('span', { class: 'perm-icon', 'aria-hidden': 'true' }, '!'),
      h('h3', { class: 'perm-title' }, 'Run outside the sandbox?'))
    : h('header', { class: 'perm-head' }, h('span', { class: 'perm-icon', 'aria-hidden': 'true' }, '!'),
      h('span', null, 'The agent wants to use ', h('strong', { class: 'perm-tool' }, req.tool)));
  const sessionTitle = escalated
    ? 'Allow commands outside the sandbox without asking for the rest of this session'
    : `Allow ${req.tool} without asking for the rest of this session`;
  return h('section', {
    class: `card perm-card${escalated ? ' perm-escalated' : ''}`, dataset: { request: req.id }, role: 'alertdialog',
    'aria-label': escalated ? 'Permission to run a command outside the sandbox' : `Permission for ${req.tool}`,
  },
    head,
    shown,
    h('div', { class: 'perm-actions' },
      h('button', { type: 'button', class: 'primary allow-once', onclick: answer('allow') }, 'Allow once'),
      !contract && h('button', { type: 'button', class: 'allow-session', onclick: answer('allow', 'session'), title: sessionTitle }, 'Allow for this session'),
      h('button', { type: 'button', class: 'danger deny', onclick: answer('deny') }, 'Deny')),
    contract && h('p', { class: 'muted small' }, 'In Plan and Goal every shell command asks (unless permissions are auto); there is no session-wide allow.'));
}
