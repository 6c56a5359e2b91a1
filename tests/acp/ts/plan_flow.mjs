// A whole plan flow through `pidesk acp`, driven by the official TypeScript ACP SDK as an editor would:
// initialize, session/new, set_mode plan, prompt; approve the contract under "ask", allow the Write.
// Usage: node plan_flow.mjs <project dir> <pidesk argv...>. Prints one JSON object of what it saw.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const [project, command, ...args] = process.argv.slice(2);
const agent = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
const stream = acp.ndJsonStream(Writable.toWeb(agent.stdin), Readable.toWeb(agent.stdout));
const seen = { updates: [], asked: [] };

const app = acp.client({ name: "pidesk-ts-test" })
  .onNotification(acp.methods.client.session.update, ({ params }) => { seen.updates.push(params.update); })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
    seen.asked.push({ title: params.toolCall.title, options: params.options.map((o) => [o.optionId, o.kind]) });
    const pick = params.options.find((o) => o.optionId === "approve-ask" || o.optionId === "allow-once");
    return { outcome: { outcome: "selected", optionId: pick.optionId } };
  });

const result = await app.connectWith(stream, async (ctx) => {
  const init = await ctx.request(acp.methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION });
  const session = await ctx.request(acp.methods.agent.session.new, { cwd: project, mcpServers: [] });
  await ctx.request(acp.methods.agent.session.setMode, { sessionId: session.sessionId, modeId: "plan" });
  const done = await ctx.request(acp.methods.agent.session.prompt, {
    sessionId: session.sessionId, prompt: [{ type: "text", text: "add a notes file" }],
  });
  return { protocolVersion: init.protocolVersion, modes: session.modes, stopReason: done.stopReason };
});
agent.stdin.end();
console.log(JSON.stringify({ ...result, ...seen }));
