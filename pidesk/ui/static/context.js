// The context line under the session header: "Context: AGENTS.md, ../AGENTS.md · skills: deploy".
// It names what the shown session's next model request includes (session.context, in the order
// included), and warns when something was found and left out (a skill with bad front matter, a
// file over the cap). Read when a session is shown, again when one of its turns ends (the
// instruction files are re-read between turns) and when its context is compacted; nothing is
// kept in the page but the last answer's ``window`` (issue 30: how full the model's context
// window is), which the session header's meter shows.

import { h, basename } from './util.js';

// ``rpc``: the page's Rpc; ``current()``: the shown session's id, or null; ``onWindow()``: the
// window figures changed (the header redraws its meter from ``window()``)
export function createContextLine(line, rpc, current, onWindow = () => {}) {
  let shown = null; // the session the line was last read for
  let asked = 0; // answers to older questions are dropped
  let windowOf = null; // {sessionId, usedTokens, limitTokens, compactions} of the last answer

  async function refresh(id) {
    shown = id;
    const ask = ++asked;
    if (!id) {
      line.hidden = true;
      setWindow(null);
      return;
    }
    let got;
    try {
      got = await rpc.call('session.context', { sessionId: id });
    } catch {
      got = null; // an older host without session.context, or the session went away: no line
    }
    if (ask !== asked) return;
    render(got);
    const w = got?.window;
    setWindow(w && w.limitTokens > 0 ? { sessionId: id, ...w } : null);
  }

  function setWindow(w) {
    const same = JSON.stringify(w) === JSON.stringify(windowOf);
    windowOf = w;
    if (!same) onWindow();
  }

  function render(got) {
    const files = got?.files || [];
    const skills = got?.skills || [];
    const warnings = got?.warnings || [];
    line.hidden = !got || (!files.length && !skills.length && !warnings.length);
    if (line.hidden) return;
    const parts = [h('span', { class: 'context-label' }, 'Context: '),
      files.length
        ? files.map((f, i) => [i ? ', ' : '', h('code', { class: 'context-file', title: `${f.path}\n${f.size} bytes` },
          f.path.startsWith('/') ? `global ${basename(f.path)}` : f.path)])
        : 'no AGENTS.md'];
    if (skills.length) {
      parts.push(' · skills: ', skills.map((s, i) => [i ? ', ' : '',
        h('span', { class: 'context-skill', title: `${s.description}\n${s.path}` }, s.name)]));
    }
    if (warnings.length) {
      parts.push(' ', h('span', { class: 'context-warn', title: warnings.join('\n') },
        `⚠ ${warnings.length} left out`));
    }
    line.replaceChildren(...parts.flat(3));
  }

  return {
    // the page shows a session (or none): read its context unless the line already is its
    show() {
      const id = current();
      if (id !== shown) refresh(id);
    },
    // the shown session's window figures, or null (none read yet, or an older host)
    window() {
      return windowOf && windowOf.sessionId === current() ? windowOf : null;
    },
    // read again now (after session.compact answered)
    refresh() {
      refresh(current());
    },
    hostEvent(ev) {
      if ((ev.type === 'turn.ended' || ev.type === 'context.compacted') && ev.sessionId === current()) refresh(ev.sessionId);
    },
    reconnected() {
      refresh(current());
    },
  };
}
