// The composer: the unsent draft (text and uploaded attachments, kept per session in the
// page), the mode chip and the permission selector with the plain sentence saying what
// the agent may do, and Send / Queue / Stop / Abort as the session's state allows.

import { h, mayDo, MODE_LABEL } from './util.js';
import { S, busy, currentSession } from './state.js';

// ``act``: {rpc, toast}
export function createComposer(el, act) {
  function draftKey() {
    return S.current || `new:${S.project ?? ''}`;
  }

  function stashDraft() {
    const text = el.input.value;
    if (text || S.attachments.length) S.drafts.set(draftKey(), { text, attachments: S.attachments });
    else S.drafts.delete(draftKey());
  }

  function unstashDraft() {
    const d = S.drafts.get(draftKey());
    setComposer(d?.text || '', d?.attachments || []);
  }

  function setComposer(text, attachments) {
    el.input.value = text;
    S.attachments = attachments.slice();
    renderAttachments();
    autosize();
  }

  function autosize() {
    el.input.style.height = 'auto';
    el.input.style.height = `${Math.min(el.input.scrollHeight, 240)}px`;
  }

  function renderAttachments() {
    el.atts.replaceChildren(...S.attachments.map((a, i) => h('span', { class: 'att', title: `${a.mime}, ${a.size} bytes` },
      a.kind === 'image' ? '🖼 ' : '📄 ', h('span', { class: 'att-name' }, a.name),
      h('button', { type: 'button', class: 'att-remove', 'aria-label': `remove ${a.name}`, onclick: () => { S.attachments.splice(i, 1); renderAttachments(); } }, '×'))));
    if (S.uploads) el.atts.append(h('span', { class: 'att uploading' }, `uploading ${S.uploads}…`));
    el.atts.hidden = !S.attachments.length && !S.uploads;
  }

  async function upload(files) {
    for (const file of files) {
      S.uploads += 1;
      renderAttachments();
      renderComposer();
      try {
        const data = await base64(file);
        const att = await act.rpc.call('attachments.put', { name: file.name || 'pasted', mime: file.type || 'application/octet-stream', data });
        S.attachments.push(att);
      } catch (err) {
        act.toast(err);
      } finally {
        S.uploads -= 1;
        renderAttachments();
        renderComposer();
      }
    }
  }

  function base64(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result).split(',', 2)[1] || '');
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
  }

  function renderComposer() {
    const s = currentSession();
    const mode = s ? s.mode : S.newSettings.mode;
    const pm = s ? s.permissionMode : S.newSettings.permissionMode;
    const isBusy = busy(s);
    const online = S.conn === 'open';
    el.chip.textContent = MODE_LABEL[mode];
    el.chip.className = `mode-chip mode-${mode}`;
    el.chip.dataset.mode = mode;
    el.chip.disabled = isBusy || !online;
    el.chip.title = isBusy ? 'The mode can change only while the session is idle' : 'Agent → Plan → Goal (click or Shift+Tab)';
    el.chip.setAttribute('aria-label', `Mode: ${MODE_LABEL[mode]}. ${el.chip.title}`);
    el.perm.value = pm;
    el.perm.disabled = isBusy || !online;
    el.perm.title = isBusy ? 'Permissions can change only while the session is idle' : 'What the agent may do without asking';
    const m = mayDo(mode, pm);
    el.mayDo.className = `may-do level-${m.level}`;
    el.mayDo.textContent = m.text;
    el.composer.dataset.mode = mode;
    el.transcript.classList.toggle('busy', isBusy);
    el.composer.dataset.permission = pm;
    el.send.textContent = isBusy ? 'Queue' : 'Send';
    el.send.title = isBusy ? 'The agent is busy: this prompt waits in the queue' : 'Send (Enter)';
    el.send.disabled = !online || S.uploads > 0;
    const running = !!s && s.status !== 'idle';
    el.stop.hidden = !running;
    el.abort.hidden = !running;
    const locked = S.conn === 'notoken' || S.conn === 'unauthorized'; // nothing can be sent without the host's token
    el.input.disabled = locked;
    el.input.placeholder = locked ? 'Not connected: this page needs the host’s token (see above)'
      : isBusy ? 'The agent is working — Enter queues this prompt, Esc aborts the turn'
        : `Message the agent in ${MODE_LABEL[mode]} mode — Enter sends, Shift+Enter for a new line, Shift+Tab changes the mode`;
  }

  return { stashDraft, unstashDraft, setComposer, autosize, renderAttachments, upload, renderComposer, draftKey };
}
