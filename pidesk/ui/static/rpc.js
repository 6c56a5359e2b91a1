// JSON-RPC 2.0 over the host's WebSocket (PROTOCOL.md "Transport").
//
// One connection at a time. Requests made while the socket is down wait for the
// next successful `host.hello`; requests in flight when it closes fail with
// DISCONNECTED (the caller re-reads state from the host after a reconnect, so
// nothing is retried blindly). Events arrive through `onEvent`. A closed socket
// is reopened with exponential backoff (250 ms doubling to 5 s, with jitter).

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
  constructor(url, { onEvent, onState, probe }) {
    this.url = url;
    this.onEvent = onEvent;
    this.onState = onState;
    this.probe = probe; // async () => 'unauthorized' | 'ok' | 'down', asked after a failed attempt
    this.ws = null;
    this.ready = false;
    this.nextId = 1;
    this.pending = new Map();
    this.waiting = []; // resolvers of calls made while not ready
    this.attempt = 0;
    this.timer = null;
  }

  connect() {
    clearTimeout(this.timer);
    this.onState(this.attempt === 0 ? 'connecting' : 'reconnecting');
    let ws;
    try {
      ws = new WebSocket(this.url);
    } catch (err) {
      this._retry();
      return;
    }
    this.ws = ws;
    let opened = false;
    ws.onopen = async () => {
      opened = true;
      try {
        const hello = await this._send('host.hello', { protocolVersion: PROTOCOL_VERSION, client: 'pidesk-web' });
        this.attempt = 0;
        this.ready = true;
        this.hello = hello;
        this.onState('open', hello);
        const waiting = this.waiting.splice(0);
        for (const resolve of waiting) resolve();
      } catch (err) {
        this.onState('failed', err);
        ws.close();
      }
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
  }

  async _retry(wasOpen) {
    this.attempt += 1;
    if (!wasOpen && this.probe && this.attempt >= 2) {
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

  async whenReady() {
    if (!this.ready) await new Promise((resolve) => this.waiting.push(resolve));
  }

  async call(method, params) {
    await this.whenReady();
    return this._send(method, params);
  }

  // One batch frame; each element of the result is the call's result or an RpcError.
  async batch(calls) {
    if (!calls.length) return [];
    await this.whenReady();
    const frames = calls.map(([method, params]) => ({ jsonrpc: '2.0', id: this.nextId++, method, params }));
    const promises = frames.map((f) => new Promise((resolve) => {
      this.pending.set(f.id, { resolve, reject: resolve, method: f.method });
    }));
    this.ws.send(JSON.stringify(frames));
    return Promise.all(promises);
  }
}
