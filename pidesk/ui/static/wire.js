// JSON-RPC 2.0 over the host's WebSocket (PROTOCOL.md "Transport").
//
// One connection at a time. Requests made while the socket is down, and those in
// flight when it closes, fail with DISCONNECTED (the page re-reads its state from
// the host after a reconnect, so nothing is retried blindly). Events arrive through
// `onEvent`. A closed socket is reopened with exponential backoff (250 ms doubling
// to 5 s, with jitter); a token the host refuses (401) stops the knocking.

export const PROTOCOL_VERSION = 1;

export class RpcError extends Error {
  constructor(method, error) {
    super(error?.message || 'request failed');
    this.method = method;
    this.rpcCode = error?.code;
    this.code = error?.data?.code || (error?.code === -32601 ? 'METHOD_NOT_FOUND' : 'RPC_ERROR');
  }
}

export class Rpc {
  constructor(url, { onEvent, onState, probe, initial }) {
    this.url = url;
    this.initial = initial; // () => [[method, params], …] sent in host.hello's frame (one round trip)
    this.onEvent = onEvent;
    this.onState = onState;
    this.probe = probe; // async () => 'unauthorized' | 'ok' | 'down', asked after a failed attempt
    this.ws = null;
    this.ready = false;
    this.nextId = 1;
    this.pending = new Map();
    this.attempt = 0;
    this.timer = null;
  }

  connect() {
    clearTimeout(this.timer);
    this.onState(this.attempt === 0 ? 'connecting' : 'reconnecting');
    // host.hello first, then the client's first reads, in one batch frame: the host answers a
    // batch in order, so the reads run only after the hello has been accepted.
    const calls = [['host.hello', { protocolVersion: PROTOCOL_VERSION, client: 'pidesk-web' }], ...(this.initial?.() || [])];
    const early = adoptEarly(calls);
    let ws;
    try {
      ws = early ? early.ws : new WebSocket(this.url);
    } catch (err) {
      this._retry(false);
      return;
    }
    this.ws = ws;
    let opened = early?.state === 'open';
    const start = async (sent) => {
      opened = true;
      let results;
      try {
        results = await (sent ? this._expect(sent, calls) : this._batch(calls));
      } catch {
        return; // closed meanwhile: onclose retries
      }
      const [hello, ...rest] = results;
      if (hello instanceof RpcError) {
        this.onState('failed', hello);
        ws.close();
        return;
      }
      this.attempt = 0;
      this.ready = true;
      this.hello = hello;
      this.onState('open', hello, rest);
    };
    ws.onmessage = (msg) => this._receive(msg.data);
    ws.onclose = () => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.ready = false;
      for (const [, p] of this.pending) p.reject(new RpcError(p.method, { message: 'disconnected from the host', data: { code: 'DISCONNECTED' } }));
      this.pending.clear();
      this._retry(opened);
    };
    if (early) {
      // boot.js sends the same frame on open; its ids are known, its answers may be here already
      const answers = this._expect(early.ids, calls);
      if (early.state === 'open') start(answers);
      else ws.addEventListener('open', () => start(answers));
      for (const frame of early.frames.splice(0)) this._receive(frame);
    } else {
      ws.onopen = () => start(null);
    }
  }

  // Futures for a frame already sent under ``ids`` (by boot.js).
  _expect(ids, calls) {
    if (ids instanceof Promise) return ids;
    return Promise.all(ids.map((id, i) => new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject: (err) => (err.code === 'DISCONNECTED' ? reject(err) : resolve(err)), method: calls[i][0] });
    })));
  }

  async _retry(wasOpen) {
    this.attempt += 1;
    // a socket that never opened: ask why at once, so a wrong token is named before any "reconnecting…"
    if (!wasOpen && this.probe) {
      const verdict = await this.probe();
      if (verdict === 'unauthorized') {
        this.onState('unauthorized');
        return; // a wrong token never starts working: stop knocking
      }
    }
    this.onState('reconnecting');
    const delay = Math.min(5000, 250 * 2 ** Math.min(this.attempt - 1, 5)) * (0.8 + Math.random() * 0.4);
    this.timer = setTimeout(() => this.connect(), delay);
  }

  _receive(raw) {
    let message;
    try {
      message = JSON.parse(raw);
    } catch {
      return;
    }
    if (Array.isArray(message)) {
      for (const item of message) this._settle(item);
      return;
    }
    if (message && message.method === 'event') {
      this.onEvent(message.params);
      return;
    }
    this._settle(message);
  }

  _settle(message) {
    const pending = this.pending.get(message?.id);
    if (!pending) return;
    this.pending.delete(message.id);
    if (message.error) pending.reject(new RpcError(pending.method, message.error));
    else pending.resolve(message.result);
  }

  _send(method, params) {
    const id = this.nextId++;
    const frame = { jsonrpc: '2.0', id, method };
    if (params !== undefined) frame.params = params;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      this.ws.send(JSON.stringify(frame));
    });
  }

  // A call made while the host is unreachable fails at once (DISCONNECTED) rather than
  // waiting: a click on Approve must not land minutes later on a host that moved on.
  _check(method) {
    if (!this.ready) throw new RpcError(method, { message: 'not connected to the host', data: { code: 'DISCONNECTED' } });
  }

  async call(method, params) {
    this._check(method);
    return this._send(method, params);
  }

  // One batch frame; each element of the result is the call's result or an RpcError.
  async batch(calls) {
    if (!calls.length) return [];
    this._check(calls[0][0]);
    return this._batch(calls);
  }

  _batch(calls) {
    const frames = calls.map(([method, params]) => ({ jsonrpc: '2.0', id: this.nextId++, method, params }));
    const promises = frames.map((f) => new Promise((resolve, reject) => {
      this.pending.set(f.id, { resolve, reject: (err) => (err.code === 'DISCONNECTED' ? reject(err) : resolve(err)), method: f.method });
    }));
    this.ws.send(JSON.stringify(frames));
    return Promise.all(promises);
  }
}

// boot.js (a classic script in <head>) opens the socket and sends the first frame while the
// modules load. Take it over when it asked for exactly what this client asks for now.
function adoptEarly(calls) {
  const early = window.pideskEarly;
  window.pideskEarly = null;
  if (!early || early.state === 'closed') return null;
  if (JSON.stringify(early.calls) !== JSON.stringify(calls)) {
    early.ws.close();
    return null;
  }
  early.ws.onmessage = null;
  early.ws.onclose = null;
  return early;
}
