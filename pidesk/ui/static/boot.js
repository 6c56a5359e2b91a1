// Opens the host connection while the page's modules load (a classic script, run at once).
//
// It sends the frame wire.js would send first — host.hello and the first reads — and keeps
// whatever arrives until wire.js takes the socket over (adoptEarly). If the two ever
// disagree about that frame, wire.js closes this socket and starts its own.
(function () {
  'use strict';
  var query = new URLSearchParams(location.search);
  var token = query.get('token');
  if (!token || typeof WebSocket !== 'function') return;
  var session = query.get('session');
  var calls = [
    ['host.hello', { protocolVersion: 1, client: 'pidesk-web' }],
    ['session.list', { limit: 100 }], // app.js's SESSION_PAGE
    ['notifications.list', { unseenOnly: true, limit: 1000 }], // app.js's UNREAD_PAGE
  ];
  if (session) {
    calls.push(['session.get', { sessionId: session, limit: 200 }], ['plans.list', { sessionId: session }],
      ['session.turns', { sessionId: session, limit: 200 }]);
  }
  var ids = calls.map(function (_, i) { return 'boot-' + i; });
  var scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  var ws;
  try {
    ws = new WebSocket(scheme + '://' + location.host + '/rpc?token=' + encodeURIComponent(token));
  } catch (err) {
    return;
  }
  var early = { ws: ws, calls: calls, ids: ids, frames: [], state: 'connecting' };
  ws.onopen = function () {
    early.state = 'open';
    ws.send(JSON.stringify(calls.map(function (c, i) {
      return { jsonrpc: '2.0', id: ids[i], method: c[0], params: c[1] };
    })));
  };
  ws.onmessage = function (m) { early.frames.push(m.data); };
  ws.onclose = function () { early.state = 'closed'; };
  window.pideskEarly = early;
}());
