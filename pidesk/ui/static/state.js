// The page's state, and how what the host says is merged into it.
//
// Only view state is the page's own (which project and session are shown, the
// composer's draft); everything else is a copy of the host's objects, kept newest.

import { basename } from './util.js';

export const S = {
  conn: 'connecting',
  sessions: new Map(), // the sessions read so far (session.list pages, newest first) and any an event named
  sessionCursor: null, // session.list's nextCursor: older sessions not read yet (null: none)
  loadingOlder: false,
  unread: new Map(), // session id -> Set of unseen notification ids
  extraProjects: new Set(), // project paths asked for in the URL or opened by hand
  project: null, // the shown project: its path, or '' for scratch sessions
  current: null, // the shown session id; null = a new session not created yet
  view: null,
  newSettings: { mode: 'agent', permissionMode: 'ask' },
  drafts: new Map(), // session id (or 'new:<project>') -> {text, attachments}
  attachments: [], // the composer's uploaded attachments
  uploads: 0,
  firstLoad: true,
  approvalCache: new Map(), // approval id -> Promise of plans.get
  approvalDetails: new Map(), // approval id -> {html, markdown, prev?} once loaded
  resyncing: null, // events held while the first reads after a (re)connect are in flight
  compacting: new Set(), // session ids whose session.compact this page asked and waits for
};

// ---- merging what the host says -----------------------------------------------------------
//
// A reply and the events around it can cross on the socket (the host sends events from
// another task than replies), so an older object may arrive after a newer one. Every
// merge keeps the newer: sessions by updatedAt, approvals and permission requests by
// their one-way lifecycles.

// Mode changes sent and not all confirmed yet, per session: {mode, count}. While any is in
// flight, the host's echoes of the earlier ones must not flip the chip back (Shift+Tab twice fast).
export const pendingModes = new Map();

export function putSession(s, force = false) {
  const known = S.sessions.get(s.id);
  if (!force && known && known.updatedAt > s.updatedAt) return false;
  const pending = pendingModes.get(s.id);
  if (pending) s = { ...s, mode: pending.mode, planState: pending.mode === 'agent' ? 'inactive' : 'planning' };
  S.sessions.set(s.id, s);
  return true;
}

const EXECUTION_RANK = { none: 0, queued: 1, running: 2, completed: 3, failed: 3, aborted: 3, interrupted: 3 };
function approvalRank(a) {
  return (a.status === 'pending' ? 0 : 10) + (EXECUTION_RANK[a.executionState] ?? 0);
}

export function putApproval(view, a) {
  const known = view.approvals.get(a.id);
  if (known && approvalRank(known) > approvalRank(a)) return false;
  view.approvals.set(a.id, a);
  return true;
}

export function putPermission(view, p) {
  if (p.status === 'pending') {
    if (!view.settled.has(p.id)) view.permissions.set(p.id, p);
  } else {
    view.settled.add(p.id);
    view.permissions.delete(p.id);
  }
}

export function newView(id) {
  return {
    id, loading: true, buffer: [], hasMore: false, minSeq: null, loadingEarlier: false,
    queue: [], approvals: new Map(), permissions: new Map(), settled: new Set(), turns: new Map(),
  };
}

export function currentSession() {
  return S.current ? S.sessions.get(S.current) || null : null;
}

export function busy(s) {
  return !!s && (s.status !== 'idle' || s.planState === 'awaiting_approval');
}

export function statusOf(s) {
  if (s.planState === 'awaiting_approval') return ['awaiting', 'awaiting approval'];
  if (s.status === 'waiting_permission') return ['waiting', 'waiting for permission'];
  if (s.status === 'running') return ['running', 'running'];
  return ['idle', 'idle'];
}

export function projectKey(s) {
  return s.projectPath ?? '';
}

export function normPath(p) {
  return p.length > 1 ? p.replace(/\/+$/, '') : p;
}

export function sessionsIn(project) {
  return [...S.sessions.values()].filter((s) => projectKey(s) === project).sort(byCreated);
}

export function byCreated(a, b) {
  return b.createdAt.localeCompare(a.createdAt) || b.id.localeCompare(a.id);
}

export function byUpdated(a, b) {
  return b.updatedAt.localeCompare(a.updatedAt);
}

export function addUnread(n) {
  if (!S.unread.has(n.sessionId)) S.unread.set(n.sessionId, new Set());
  S.unread.get(n.sessionId).add(n.id);
}

export function projects() {
  const keys = new Set();
  for (const s of S.sessions.values()) keys.add(projectKey(s));
  for (const p of S.extraProjects) keys.add(p);
  if (S.project !== null) keys.add(S.project);
  return [...keys].sort((a, b) => (a === '') - (b === '') || basename(a).localeCompare(basename(b)));
}
