// The Schedules panel (a modal dialog opened from the header): lists the host's
// schedules, creates one for the shown project, and runs or deletes one (after a
// confirmation). Everything shown is read from the host (schedules.list) when the panel
// opens or changes, when a turn ends somewhere (a scheduled run may have finished), every
// second while a run it shows is still running, and every 30 s while it is open (next run).
// Schedules run unattended, so only Agent mode is offered: Plan and Goal are listed as
// refused, with why.

import { h, ago, clip, explain, MODE_LABEL, PERMISSION_LABEL } from './util.js';
import { S } from './state.js';

const MODES = ['agent', 'plan', 'goal'];
const PERMISSIONS = ['ask', 'accept-edits', 'auto'];

// ``act``: {rpc, toast}
export function createSchedules(el, act) {
  const dialog = el.schedulesDialog;
  const list = dialog.querySelector('.sched-list');
  const form = dialog.querySelector('.sched-form');
  const result = dialog.querySelector('.sched-result');
  const where = dialog.querySelector('.sched-project');
  const field = (name) => form.elements.namedItem(name);

  field('mode').replaceChildren(...MODES.map((m) => (m === 'agent'
    ? h('option', { value: m }, MODE_LABEL[m])
    : h('option', { value: m, disabled: true, title: explain('PLAN_REQUIRES_INTERACTIVE_SESSION') }, `${MODE_LABEL[m]} — needs a person to approve`))));
  let confirming = null; // the schedule whose Delete awaits a confirmation
  let again = null; // the next refresh while a run is still running
  let every = null; // the 30 s refresh while open
  let soon = null; // a refresh asked for by a host event
  field('permissionMode').replaceChildren(...PERMISSIONS.map((p) => h('option', { value: p }, PERMISSION_LABEL[p])));

  async function refresh() {
    clearTimeout(again);
    again = null;
    try {
      const { schedules } = await act.rpc.call('schedules.list', {});
      render(schedules);
      if (dialog.open && schedules.some((s) => s.lastRun?.status === 'running')) again = setTimeout(refresh, 1000);
    } catch (err) {
      fail(err);
    }
  }

  // A turn ended or a session appeared: a scheduled run may have started or finished.
  function hostEvent(ev) {
    if (!dialog.open || soon) return;
    if (ev.type !== 'turn.ended' && ev.type !== 'notification.created' && ev.type !== 'session.updated') return;
    soon = setTimeout(() => { soon = null; refresh(); }, 150);
  }

  function render(schedules) {
    if (!schedules.length) {
      list.replaceChildren(h('p', { class: 'muted sched-empty' }, 'No schedules yet.'));
      return;
    }
    list.replaceChildren(h('table', { class: 'sched-table' },
      h('thead', null, h('tr', null, ['Name', 'Cron', 'Mode', 'Next run', 'Last run', ''].map((t) => h('th', null, t)))),
      h('tbody', null, schedules.map(row))));
  }

  function row(s) {
    const last = s.lastRun;
    return h('tr', { class: 'sched-row', dataset: { schedule: s.id } },
      h('td', { class: 'sched-name', title: `${s.projectPath}\n${s.prompt}` }, s.name,
        h('div', { class: 'muted small' }, clip(s.prompt, 60))),
      h('td', { dataset: { label: 'Cron' } }, h('code', { class: 'sched-cron' }, s.cron)),
      h('td', { dataset: { label: 'Mode' } }, h('span', { class: `mini-mode mode-${s.mode}` }, MODE_LABEL[s.mode] || s.mode),
        h('div', { class: 'muted small' }, PERMISSION_LABEL[s.permissionMode] || s.permissionMode)),
      h('td', { class: 'sched-next', title: s.nextRunAt, dataset: { label: 'Next run' } }, s.enabled ? whenText(s.nextRunAt) : 'disabled'),
      h('td', { class: 'sched-last', dataset: { label: 'Last run' } }, last
        ? [h('span', { class: `sched-status sched-${last.status}` }, last.status),
          last.errorCode && h('code', { class: 'sched-code', title: explain(last.errorCode) }, last.errorCode),
          h('div', { class: 'muted small', title: last.at }, ago(last.at))]
        : h('span', { class: 'muted' }, 'never')),
      h('td', { class: 'sched-actions' }, confirming === s.id
        ? h('div', { class: 'sched-confirm', role: 'group', 'aria-label': `Delete ${s.name}` },
          h('span', null, `Delete “${s.name}”? Its past runs’ sessions stay.`),
          h('button', { type: 'button', class: 'danger confirm-delete', onclick: () => remove(s) }, 'Delete'),
          h('button', { type: 'button', onclick: () => { confirming = null; refresh(); } }, 'Cancel'))
        : [h('button', { type: 'button', onclick: () => runNow(s) }, 'Run now'),
          h('button', { type: 'button', class: 'danger', onclick: () => { confirming = s.id; refresh(); } }, 'Delete')]));
  }

  function whenText(iso) {
    const t = Date.parse(iso);
    return Number.isNaN(t) ? iso : new Date(t).toLocaleString();
  }

  async function runNow(s) {
    try {
      const r = await act.rpc.call('schedules.runNow', { scheduleId: s.id });
      showResult(s, r);
    } catch (err) {
      fail(err);
    }
    refresh();
  }

  function showResult(s, r) {
    result.hidden = false;
    result.className = `sched-result ${r.errorCode ? 'sched-refused' : 'sched-started'}`;
    result.replaceChildren(...(r.errorCode
      ? [h('strong', null, `“${s.name}” was refused: `), h('code', { class: 'sched-result-code' }, r.errorCode),
        h('span', null, ` ${explain(r.errorCode)}`)]
      : [h('strong', null, `“${s.name}” started`), h('span', null, ` in a new session (${r.sessionId}).`)]));
  }

  // Errors show inside the dialog: a modal dialog sits above the page's toasts.
  function fail(err) {
    const code = err?.code;
    result.hidden = false;
    result.className = 'sched-result sched-refused';
    const text = h('span', null, ` ${typeof err === 'string' ? err : err?.message || String(err)}`);
    if (code) result.replaceChildren(h('code', { class: 'sched-result-code' }, code), text);
    else result.replaceChildren(text);
  }

  async function remove(s) {
    confirming = null;
    try {
      await act.rpc.call('schedules.delete', { scheduleId: s.id });
    } catch (err) {
      fail(err);
    }
    refresh();
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (!S.project) {
      fail('Schedules run in a project folder: open a project tab first.');
      return;
    }
    const params = {
      name: field('name').value.trim(), cron: field('cron').value.trim(), projectPath: S.project,
      prompt: field('prompt').value, mode: field('mode').value, permissionMode: field('permissionMode').value,
    };
    let made;
    try {
      made = await act.rpc.call('schedules.create', params);
      field('name').value = '';
      field('prompt').value = '';
    } catch (err) {
      fail(err);
      return;
    }
    // the result line now says what happened last: an earlier error must not linger
    result.hidden = false;
    result.className = 'sched-result sched-started';
    result.replaceChildren(h('strong', null, `“${made.name}” created.`), h('span', null, ` Next run: ${whenText(made.nextRunAt)}.`));
    refresh();
  });

  function open() {
    where.textContent = S.project || 'no project open — pick a project tab to create a schedule';
    form.querySelector('button[type="submit"]').disabled = !S.project;
    result.hidden = true;
    confirming = null;
    if (!dialog.open) dialog.showModal();
    clearInterval(every);
    every = setInterval(refresh, 30000);
    refresh();
  }

  dialog.addEventListener('close', () => {
    clearInterval(every);
    clearTimeout(again);
    every = null;
    again = null;
  });
  dialog.querySelector('.sched-close').addEventListener('click', () => dialog.close());
  // A modal dialog's backdrop is the dialog element itself: a click there, outside its box, closes it
  // (pressed there too: a text selection dragged out of a field is not a click outside).
  let pressedOutside = false;
  const outsideDialog = (e) => {
    const box = dialog.getBoundingClientRect();
    return e.target === dialog && (e.clientX < box.left || e.clientX > box.right || e.clientY < box.top || e.clientY > box.bottom);
  };
  dialog.addEventListener('pointerdown', (e) => { pressedOutside = outsideDialog(e); });
  dialog.addEventListener('click', (e) => {
    if (pressedOutside && outsideDialog(e)) dialog.close();
    pressedOutside = false;
  });

  el.schedulesButton.addEventListener('click', open);
  return { open, hostEvent };
}
