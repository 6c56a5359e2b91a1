// The Schedules panel (a modal dialog opened from the header): lists the host's
// schedules, creates one for the shown project, and runs or deletes one. Everything
// shown is read from the host (schedules.list) each time the panel opens or changes.

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

  field('mode').replaceChildren(...MODES.map((m) => h('option', { value: m }, MODE_LABEL[m])));
  field('permissionMode').replaceChildren(...PERMISSIONS.map((p) => h('option', { value: p }, PERMISSION_LABEL[p])));

  async function refresh() {
    try {
      const { schedules } = await act.rpc.call('schedules.list', {});
      render(schedules);
    } catch (err) {
      fail(err);
    }
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
      h('td', null, h('code', { class: 'sched-cron' }, s.cron)),
      h('td', null, h('span', { class: `mini-mode mode-${s.mode}` }, MODE_LABEL[s.mode] || s.mode),
        h('div', { class: 'muted small' }, PERMISSION_LABEL[s.permissionMode] || s.permissionMode)),
      h('td', { class: 'sched-next', title: s.nextRunAt }, s.enabled ? whenText(s.nextRunAt) : 'disabled'),
      h('td', { class: 'sched-last' }, last
        ? [h('span', { class: `sched-status sched-${last.status}` }, last.status),
          last.errorCode && h('code', { class: 'sched-code', title: explain(last.errorCode) }, last.errorCode),
          h('div', { class: 'muted small', title: last.at }, ago(last.at))]
        : h('span', { class: 'muted' }, 'never')),
      h('td', { class: 'sched-actions' },
        h('button', { type: 'button', onclick: () => runNow(s) }, 'Run now'),
        h('button', { type: 'button', class: 'danger', onclick: () => remove(s) }, 'Delete')));
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
    try {
      await act.rpc.call('schedules.create', params);
      field('name').value = '';
      field('prompt').value = '';
    } catch (err) {
      fail(err);
      return;
    }
    refresh();
  });

  function open() {
    where.textContent = S.project || 'no project open — pick a project tab to create a schedule';
    form.querySelector('button[type="submit"]').disabled = !S.project;
    result.hidden = true;
    if (!dialog.open) dialog.showModal();
    refresh();
  }

  dialog.querySelector('.sched-close').addEventListener('click', () => dialog.close());
  el.schedulesButton.addEventListener('click', open);
  return { open };
}
