// What each turn changed in the workspace, and taking it back (issue 17: session.changes,
// session.revert). Everything comes from the host, which keeps each turn's list of files
// (issue 33 §1). The page asks:
// - when a session is shown (or the connection comes back): the list of its turns, a page of
//   up to 1,000 at a time, without diffs (the host reads stored rows: no git);
// - when one of its turns ends, or a revert is made: that turn (or revert) only, without diffs
//   (no git either: its row);
// - when the panel shows a turn whose diffs it does not have: that turn, with its diffs.
//
// - Each finished turn that changed files gets a line after its last message:
//   "N files changed +a −b" (a button: it opens the Changes panel at that turn). An
//   execution's approval card says the same of its execution turn.
// - A bar above the transcript totals the session's changes and opens the panel.
// - The panel lists the turns oldest first, each named by its prompt's first line and its time
//   (issue 31 §4), each file's unified diff coloured and folded when long, and Revert per turn: a
//   confirmation lists the files that turn and the later ones changed and says that hand edits
//   made since are reverted too. A revert is listed as an entry of its own, whose Revert undoes it.

import { h, clip } from './util.js';

const FOLD_LINES = 80; // a file diff longer than this starts folded
const SHOWN_LINES = 400; // lines shown of an unfolded diff until "Show all"
const PAGE = 1000; // turns asked per session.changes page
const MAX_PAGES = 1000;
const PROMPT_SHOWN = 80; // characters of a turn's prompt in its heading

// ``main``: the element holding the transcript; ``list``: #messages; ``rpc``: the page's Rpc;
// ``current()``: the shown session's id, or null; ``toast(text, kind)``
export function createChanges({ main, transcript, list, rpc, current, toast }) {
  let shown = null; // the session ``data`` belongs to
  let data = null; // {turns, note}: its turns (a turn's files carry ``diff`` once asked with diffs)
  let asked = 0;
  let loading = null; // the list being read, while it is
  let scheduled = false;
  const loadingTurns = new Set(); // turns whose diffs are being asked

  const bar = h('div', { class: 'changes-bar', hidden: true });
  main.insertBefore(bar, transcript);
  document.head.append(h('link', { rel: 'stylesheet', href: 'changes.css' }));
  const dialog = h('dialog', { class: 'changes-dialog', 'aria-labelledby': 'changes-title' });
  document.body.append(dialog);
  dialog.addEventListener('click', (e) => { if (e.target === dialog) dialog.close(); });
  // A turn shown in the panel without its diffs asks for them once it scrolls into view.
  const seen = new IntersectionObserver((entries) => {
    for (const entry of entries) if (entry.isIntersecting) loadTurn(entry.target.dataset.turn);
  });

  // The transcript renders (and re-renders) messages and cards on its own: place what is missing.
  new MutationObserver(() => schedule()).observe(list, { childList: true, subtree: true });

  function schedule() {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => { scheduled = false; decorate(); });
  }

  // Every turn of the session, page by page, without diffs.
  async function readAll(id) {
    const turns = [];
    let note = null;
    let cursor = null;
    for (let n = 0; n < MAX_PAGES; n += 1) {
      const page = await rpc.call('session.changes', cursor ? { sessionId: id, limit: PAGE, cursor } : { sessionId: id, limit: PAGE });
      turns.push(...page.turns);
      note = page.note;
      cursor = page.nextCursor;
      if (!cursor) break;
    }
    return { turns, note };
  }

  async function refresh(id) {
    shown = id;
    const ask = ++asked;
    let got = null;
    const done = (async () => {
      if (!id) return;
      try {
        got = await readAll(id);
      } catch {
        got = null; // an older host, or the session went away
      }
    })();
    loading = done;
    await done;
    if (ask !== asked) return;
    loading = null;
    data = got;
    rerender();
  }

  function rerender() {
    list.querySelectorAll('.turn-changes, .card-changes').forEach((el) => el.remove());
    renderBar();
    decorate();
    if (dialog.open) renderPanel();
  }

  // One turn (or revert), with its diffs or not, put in its place in ``data``.
  async function fetchTurn(id, turnId, diff) {
    const got = await rpc.call('session.changes', diff ? { sessionId: id, turnId } : { sessionId: id, turnId, diff: false });
    if (id !== shown || !data) return null;
    const entry = got.turns[0];
    if (!entry) return null;
    data.note = got.note;
    const at = data.turns.findIndex((t) => t.turnId === entry.turnId);
    if (at >= 0) data.turns[at] = entry;
    else {
      const later = data.turns.findIndex((t) => (t.at || '') > (entry.at || ''));
      data.turns.splice(later < 0 ? data.turns.length : later, 0, entry);
    }
    return entry;
  }

  // A turn of the shown session ended: ask for it alone.
  async function turnEnded(id, turnId) {
    if (loading) await loading;
    if (id !== shown || !data) return;
    try {
      if (!await fetchTurn(id, turnId, false)) return;
    } catch {
      return; // an older host (it lists no single turn), or the session went away
    }
    rerender();
  }

  async function loadTurn(turnId) {
    const id = shown;
    const t = data?.turns.find((x) => x.turnId === turnId);
    if (!t || loadingTurns.has(turnId) || t.files.every((f) => f.diff !== undefined)) return;
    loadingTurns.add(turnId);
    try {
      const entry = await fetchTurn(id, turnId, true);
      if (entry && dialog.open) replaceSection(entry);
    } catch {
      // the session went away: the panel keeps what it has
    } finally {
      loadingTurns.delete(turnId);
    }
  }

  function totals(files) {
    return { n: files.length, add: files.reduce((s, f) => s + f.additions, 0), del: files.reduce((s, f) => s + f.deletions, 0) };
  }

  function summary(files) {
    const { n, add, del } = totals(files);
    return [`${n} file${n === 1 ? '' : 's'} changed `, h('span', { class: 'diff-add-n' }, `+${add}`), ' ',
      h('span', { class: 'diff-del-n' }, `−${del}`)];
  }

  function renderBar() {
    const turns = data?.turns || [];
    const paths = new Set(turns.flatMap((t) => t.files.map((f) => f.path)));
    bar.hidden = !data || (!paths.size && !data.note);
    if (bar.hidden) return;
    const changed = turns.filter((t) => t.files.length && !t.revert).length;
    bar.replaceChildren(...[
      h('span', null, paths.size ? `Changes: ${paths.size} file${paths.size === 1 ? '' : 's'} in ${changed} turn${changed === 1 ? '' : 's'}` : 'Changes'),
      data.note && h('span', { class: 'changes-note', title: data.note }, ` ⚠ ${data.note}`),
      h('button', { class: 'link changes-open', type: 'button', onclick: () => open(null) }, 'Review and undo'),
    ].filter(Boolean));
  }

  // "N files changed +a −b" after each turn's last message, and on an execution's approval card.
  function decorate() {
    if (!data || shown !== current()) return;
    for (const t of data.turns) {
      if (!t.files.length || t.revert) continue;
      const key = CSS.escape(t.turnId);
      const card = list.querySelector(`.card.approval[data-exec-turn="${key}"]`);
      if (card && !card.querySelector('.card-changes')) {
        card.append(h('p', { class: 'card-changes' }, 'The execution changed: ',
          h('button', { class: 'link', type: 'button', onclick: () => open(t.turnId) }, summary(t.files))));
      }
      if (list.querySelector(`.turn-changes[data-turn="${key}"]`)) continue;
      const last = [...list.querySelectorAll(`.msg[data-turn="${key}"]`)].pop();
      if (!last) continue;
      const seq = Number(last.dataset.seq) + 0.4;
      last.after(h('div', { class: 'turn-changes', dataset: { turn: t.turnId, seq: String(seq) }, role: 'note' },
        h('button', { class: 'link', type: 'button', title: 'Review these changes, or undo them',
          onclick: () => open(t.turnId) }, summary(t.files))));
    }
  }

  function open(turnId) {
    renderPanel();
    if (!dialog.open) dialog.showModal();
    const target = turnId && dialog.querySelector(`.changes-turn[data-turn="${CSS.escape(turnId)}"]`);
    if (target) target.scrollIntoView({ block: 'start' });
  }

  // A turn is named by its prompt's first line and its time; a revert by what it took back.
  function title(t) {
    if (t.revert) {
      const of = data?.turns.find((x) => x.turnId === t.revertOf);
      const what = !of ? 'an earlier state' : of.revert ? 'a revert' : of.prompt ? `“${clip(of.prompt, PROMPT_SHOWN)}”` : 'a turn';
      return h('strong', { class: 'changes-turn-title' }, `Revert of ${what}`);
    }
    return h('strong', { class: 'changes-turn-title', title: t.prompt || '' },
      t.prompt ? `“${clip(t.prompt, PROMPT_SHOWN)}”` : 'A turn with no prompt text');
  }

  function when(at) {
    const d = new Date(at);
    if (!at || Number.isNaN(d.getTime())) return null;
    const pad = (n) => String(n).padStart(2, '0');
    const time = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
    const today = new Date();
    const day = d.toDateString() === today.toDateString() ? '' : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `;
    return h('time', { class: 'changes-turn-time muted small', datetime: at }, day + time);
  }

  function section(t, index, turns, confirming, error) {
    const el = h('section', { class: `changes-turn${t.revert ? ' is-revert' : ''}`, dataset: { turn: t.turnId } },
      h('header', { class: 'changes-turn-head' },
        title(t), ' ', when(t.at), ' ',
        t.files.length ? h('span', { class: 'changes-sum' }, summary(t.files)) : h('span', { class: 'muted' }, 'no changes'),
        h('button', { class: 'danger changes-revert', type: 'button', onclick: () => renderPanel(t.turnId) },
          t.revert ? 'Undo this revert' : 'Revert to before this turn')));
    if (confirming === t.turnId) el.append(confirmBox(turns.slice(index), t, error));
    for (const f of t.files) el.append(fileDiff(f, () => loadTurn(t.turnId)));
    if (t.files.some((f) => f.diff === undefined)) seen.observe(el);
    return el;
  }

  function replaceSection(entry) {
    const old = dialog.querySelector(`.changes-turn[data-turn="${CSS.escape(entry.turnId)}"]`);
    if (!old) return;
    const turns = data.turns;
    const index = turns.findIndex((t) => t.turnId === entry.turnId);
    seen.unobserve(old);
    const confirming = old.querySelector('.changes-confirm') ? entry.turnId : null;
    old.replaceWith(section(entry, index, turns, confirming, null));
  }

  function renderPanel(confirming = null, error = null) {
    const turns = data?.turns || [];
    const head = h('div', { class: 'changes-head' },
      h('h2', { id: 'changes-title' }, 'Changes'),
      h('button', { class: 'ghost', type: 'button', 'aria-label': 'Close', onclick: () => dialog.close() }, '✕'));
    const body = h('div', { class: 'changes-body' });
    if (data?.note) body.append(h('p', { class: 'changes-note' }, data.note));
    if (!turns.length) body.append(h('p', { class: 'muted' }, 'No turns yet.'));
    seen.disconnect();
    turns.forEach((t, index) => body.append(section(t, index, turns, confirming, error)));
    dialog.replaceChildren(head, body);
    const box = dialog.querySelector('.changes-confirm');
    if (box) box.scrollIntoView({ block: 'nearest' });
  }

  function confirmBox(later, t, error) {
    const paths = [...new Set(later.flatMap((x) => x.files.map((f) => f.path)))].sort();
    const undone = later.filter((x) => !x.revert).length;
    const what = t.revert
      ? 'Undo this revert: the workspace goes back to what it was just before it.'
      : `Put the workspace back as it was before this turn, undoing it${undone > 1 ? ` and ${undone - 1} later turn${undone > 2 ? 's' : ''}` : ''}.`;
    return h('div', { class: 'changes-confirm', role: 'alertdialog', 'aria-label': 'Confirm the revert' },
      h('p', null, what),
      paths.length ? [h('p', null, 'These files change back:'), h('ul', { class: 'changes-files' }, paths.map((p) => h('li', null, h('code', null, p))))]
        : h('p', null, 'No file change was recorded since then.'),
      h('p', { class: 'small' }, 'Files changed by hand since then (or by another session in this project) are reverted too. ' +
        'Files ignored by .gitignore and .pi/ are never touched. The revert can itself be undone.'),
      error && h('p', { class: 'changes-error', role: 'alert' }, error),
      h('div', { class: 'changes-actions' },
        h('button', { class: 'danger changes-do', type: 'button', onclick: (e) => revert(t.turnId, e.target) }, 'Revert'),
        h('button', { class: 'ghost', type: 'button', onclick: () => renderPanel() }, 'Cancel')));
  }

  async function revert(turnId, button) {
    button.disabled = true;
    const id = shown;
    try {
      const got = await rpc.call('session.revert', { sessionId: id, turnId });
      const kept = got.notRestored || [];
      toast(`Reverted ${got.files.length} file${got.files.length === 1 ? '' : 's'}` + (kept.length
        ? `; left as they are (too large to checkpoint): ${kept.join(', ')}` : ''), kept.length ? 'warn' : 'info');
      if (!got.revertId || !await fetchTurn(id, got.revertId, false).catch(() => null)) {
        await refresh(id);
        return;
      }
      rerender();
    } catch (err) {
      const code = err?.code || err?.data?.code;
      const why = code === 'AGENT_BUSY' ? 'The session is busy: revert once its turn has finished.' : (err?.message || String(err));
      renderPanel(turnId, why);
    }
  }

  return {
    show() {
      const id = current();
      if (id !== shown) refresh(id);
      else decorate();
    },
    hostEvent(ev) {
      if (ev.type === 'turn.ended' && ev.sessionId === current()) turnEnded(ev.sessionId, ev.turnId);
    },
    reconnected() {
      refresh(current());
    },
  };
}

// One file's unified diff: added lines green, removed red, hunks marked; folded when long.
// A file too large to checkpoint (tooLarge) or binary has no diff: a sentence says why. A file
// listed without its diff (``diff`` absent) shows it once ``load()`` brings it.
export function fileDiff(f, load = null) {
  const { path, status, additions, deletions } = f;
  const binary = f.binary || f.diff === 'binary';
  const counts = f.tooLarge ? h('span', { class: 'changes-too-large' }, 'too large to checkpoint')
    : binary ? h('span', { class: 'muted' }, 'binary')
      : [h('span', { class: 'diff-add-n' }, `+${additions}`), ' ', h('span', { class: 'diff-del-n' }, `−${deletions}`)];
  const head = h('summary', { class: 'changes-file-head' },
    h('code', null, path), ' ', h('span', { class: `changes-status st-${status}` }, status), ' ', counts);
  const details = h('details', { class: 'changes-file', dataset: { path } }, head);
  if (binary && !f.tooLarge) {
    details.append(h('p', { class: 'muted small' }, 'A binary file: no text diff.'));
    return details;
  }
  if (f.diff === undefined) {
    details.append(h('p', { class: 'muted small changes-loading' }, 'Loading the diff…'));
    details.open = Boolean(f.tooLarge) || additions + deletions <= FOLD_LINES;
    if (load) details.addEventListener('toggle', () => { if (details.open) load(); });
    return details;
  }
  if (f.tooLarge) {
    details.append(h('p', { class: 'muted small' }, f.diff));
    details.open = true;
    return details;
  }
  const lines = f.diff.split('\n').filter((l, i, all) => !(i === all.length - 1 && l === ''))
    .filter((l) => !/^(diff --git|index |--- |\+\+\+ |new file mode|deleted file mode)/.test(l));
  const pre = h('div', { class: 'diff changes-diff' });
  const fill = (n) => pre.replaceChildren(...lines.slice(0, n).map((l) => h('div', {
    class: `diff-line ${l.startsWith('@@') ? 'diff-hunk' : l.startsWith('+') ? 'diff-add' : l.startsWith('-') ? 'diff-del' : 'diff-ctx'}`,
  }, h('span', { class: 'diff-text' }, l || ' '))));
  fill(SHOWN_LINES);
  details.append(pre);
  if (lines.length > SHOWN_LINES) {
    details.append(h('button', { class: 'link', type: 'button', onclick: (e) => { fill(lines.length); e.target.remove(); } },
      `Show all ${lines.length} lines`));
  }
  details.open = lines.length <= FOLD_LINES;
  return details;
}
