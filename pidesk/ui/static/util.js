// Small helpers: element building, formatting, and the words the page uses for host codes.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value === undefined || value === null || value === false) continue;
      if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
      else if (key === 'class') el.className = value;
      else if (key === 'text') el.textContent = value;
      else if (key === 'dataset') Object.assign(el.dataset, value);
      else if (value === true) el.setAttribute(key, '');
      else el.setAttribute(key, String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

export function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(n < 10240 ? 1 : 0)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

export function duration(ms) {
  if (ms === undefined || ms === null) return '';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

export function ago(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return '';
  const s = Math.max(0, (Date.now() - t) / 1000);
  if (s < 45) return 'just now';
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return iso.slice(0, 10); // toLocaleDateString costs ~30 ms on its first call (ICU): not on the open path
}

export function basename(path) {
  if (!path) return 'Scratch';
  const parts = path.replace(/\/+$/, '').split('/');
  return parts[parts.length - 1] || path;
}

export function clip(text, n) {
  const one = String(text ?? '').replace(/\s+/g, ' ').trim();
  return one.length > n ? `${one.slice(0, n - 1)}…` : one;
}

// The one argument that says what a tool call does, for its row.
const MAIN_ARG = {
  Read: 'path', Write: 'path', Edit: 'path', Glob: 'pattern', Grep: 'pattern', Bash: 'command',
  BrowserPreview: 'url', EnterPlanMode: 'reason', EnterGoalMode: 'reason', SubmitPlan: 'title',
  SubmitGoal: 'title', NewContext: 'summary', Task: 'description',
};

export function shortArgs(name, args) {
  if (!args || typeof args !== 'object') return '';
  const key = MAIN_ARG[name];
  if (key && typeof args[key] === 'string') return clip(args[key], 90);
  if (name === 'ReportCriteria' && Array.isArray(args.results)) {
    const counts = {};
    for (const r of args.results) counts[r.outcome] = (counts[r.outcome] || 0) + 1;
    return Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(', ');
  }
  if (name === 'TaskWait' && Array.isArray(args.taskIds)) return args.taskIds.join(', ');
  const first = Object.values(args).find((v) => typeof v === 'string');
  return first ? clip(first, 90) : clip(JSON.stringify(args), 90);
}

// What each stable code means to a person (PROTOCOL.md "Errors").
export const CODE_TEXT = {
  WRITE_DISABLED_IN_PLAN: 'Plan and Goal modes never write files; the agent can only propose the change.',
  EDIT_DISABLED_IN_PLAN: 'Plan and Goal modes never edit files; the agent can only propose the change.',
  PLUGIN_DISABLED_IN_PLAN: 'Plugin tools are off in Plan and Goal modes.',
  TOOL_DISABLED_IN_PLAN: 'That tool is not available in Plan and Goal modes.',
  TOOL_NOT_FOUND: 'The agent asked for a tool this host does not have.',
  TOOL_ERROR: 'A plugin tool failed: its server reported an error, crashed, or could not be reached.',
  TOOL_DENIED: 'You denied this tool call.',
  PATH_OUTSIDE_WORKSPACE: 'The path is outside the session’s project folder, so the host refused it.',
  WORKSPACE_PATH_DENIED: 'Host-owned or secret paths (.pi/, .git/, .env, keys) are never touched by tools.',
  PLAN_KIND_MISMATCH: 'The agent submitted the wrong kind of contract for this mode.',
  PLAN_NOT_ACTIVE: 'Submitting a plan needs Plan or Goal mode.',
  TOOL_BATCH_EXCLUSIVE: 'Entering a mode or submitting must be the only call in its batch; nothing in the batch ran.',
  PLAN_APPROVAL_TIMEOUT: 'Nobody decided before the approval deadline, so the plan expired.',
  PLAN_APPROVAL_INTERRUPTED: 'The turn was aborted or the host restarted while the plan waited for you.',
  PLAN_REJECTED: 'You rejected this submission; the agent saw your feedback.',
  PLAN_ARTIFACT_HASH_MISMATCH: 'The approved file changed after approval, so nothing was run.',
  FILE_NOT_FOUND: 'The file does not exist.',
  TOOL_TIMEOUT: 'The tool ran past its time limit and was stopped.',
  TOOL_ABORTED: 'The turn was aborted while this tool ran.',
  TOOL_BINARY_CONTENT: 'The file is binary, so its content was not shown to the agent.',
  PLAN_ALREADY_ACTIVE: 'The session is already in a contract mode (or an approved contract is executing).',
  PLAN_WORKSPACE_REQUIRED: 'Plan and Goal need a project folder; this session has none.',
  PERMISSION_REQUIRED: 'An unattended run needed a permission nobody could give.',
  GOAL_UNREPORTED: 'The goal execution ended without reporting its acceptance criteria.',
  GOAL_BLOCKED: 'A boundary of the goal blocked a criterion, so the execution stopped.',
  INVALID_ARGUMENTS: 'The agent called the tool with arguments that do not fit it.',
  PROVIDER_ERROR: 'The model provider answered with an error.',
  PROVIDER_UNAUTHORIZED: 'The model provider refused the credentials.',
  PROVIDER_RATE_LIMITED: 'The model provider kept rate-limiting the requests.',
  PROVIDER_SECRET_MISSING: 'No API key is configured for the model provider.',
  MODEL_NOT_CONFIGURED: 'No model is configured for this host.',
  STREAM_FAILED: 'The model’s answer broke off and retries were spent.',
  PLAN_EXECUTION_INTERRUPTED: 'The host restarted while the execution ran; nothing resumes by itself.',
  INTERRUPTED: 'The host restarted while this turn ran.',
  PLAN_REQUIRES_INTERACTIVE_SESSION: 'Plan and Goal need someone to approve, so an unattended run cannot use them.',
  PERSISTENCE_FAILURE: 'The host could not save to disk; nothing changed.',
  INTERNAL: 'The host hit an internal error.',
  AGENT_BUSY: 'The session is busy; wait for it or abort it first.',
  TURN_ENDED: 'That turn has already ended.',
  STALE_REQUEST: 'That request was already answered.',
  PLAN_ALREADY_RESOLVED: 'That approval was already decided.',
  PLAN_APPROVAL_STALE: 'Nobody is waiting for that approval any more.',
  PLAN_NOT_FOUND: 'The host does not know that approval.',
  NOT_FOUND: 'The host does not know that item.',
  DISCONNECTED: 'The connection to the host dropped; it reconnects by itself.',
  SANDBOX_UNAVAILABLE: 'Bash runs in a sandbox on this host and the sandbox could not start, so the command never ran: install bubblewrap, or turn the sandbox off.',
  BASH_ESCALATION_DENIED_IN_PLAN: 'Plan and Goal never run a command outside the sandbox.',
};

export function explain(code) {
  return CODE_TEXT[code] || '';
}

// What host.hello said about the host (set on every connect). ``sandbox``: PROTOCOL.md
// "Turn-3 additions", {mode: 'bwrap'|'off', available, network, detail}; null from a host
// that does not say.
export const hostInfo = { strictPlanning: false, sandbox: null };

// The header's word for the sandbox Bash runs in (``short``: on a narrow screen, beside the
// shield), and what it means (its tooltip, and the toast a tap on it shows where there is no
// hover). null: the host did not say.
export function sandboxInfo(sb) {
  if (!sb || typeof sb !== 'object') return null;
  if (sb.mode === 'off') {
    return {
      level: 'off', label: 'sandbox off', short: 'off',
      text: 'Sandbox off: Bash runs with your full power: it can read the host’s token and reach the network.',
    };
  }
  if (!sb.available) {
    const why = typeof sb.detail === 'string' && sb.detail ? sb.detail : 'the sandbox could not start';
    return { level: 'unavailable', label: 'sandbox unavailable', short: 'error', text: `Every Bash command fails: ${why}` };
  }
  return {
    level: 'on', label: 'sandboxed', short: '',
    text: `Bash runs in a bubblewrap sandbox: writes only in the project, ${sb.network ? 'network on' : 'no network'}`,
  };
}

// What the agent may do, in plain words, for a mode and permission mode.

export function mayDo(mode, permissionMode) {
  if (mode === 'agent') {
    return {
      ask: { text: 'Asks you before every file edit and every shell command.', level: 'safe' },
      'accept-edits': { text: 'Edits files without asking. Asks before every shell command.', level: 'edits' },
      auto: {
        text: hostInfo.sandbox?.mode === 'bwrap'
          ? 'Edits files and runs shell commands without asking, in the sandbox (leaving it always asks).'
          : 'Edits files and runs shell commands without asking.',
        level: 'auto',
      },
    }[permissionMode];
  }
  const M = mode === 'plan' ? 'Plan' : 'Goal';
  if (permissionMode === 'auto' && hostInfo.strictPlanning) {
    return {
      text: `${M} stays read-only under auto: this host runs Bash in a read-only sandbox while planning (strict planning). Write and Edit stay blocked until you approve.`,
      level: 'safe',
    };
  }
  if (permissionMode === 'auto') {
    return {
      text: `${M} is not read-only under auto: Bash runs without asking and can change files. Write and Edit stay blocked until you approve.`,
      level: 'auto',
    };
  }
  return {
    text: `${M}: no file writes or edits until you approve. Asks before every shell command (Bash can still change files if you allow it).`,
    level: 'safe',
  };
}

export const PERMISSION_LABEL = { ask: 'Ask', 'accept-edits': 'Accept edits', auto: 'Auto' };
export const MODE_LABEL = { agent: 'Agent', plan: 'Plan', goal: 'Goal' };
