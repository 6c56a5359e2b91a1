// A line diff (longest common subsequence) between two revisions of a plan.
// Plans are short; above LIMIT lines a side the diff is a plain replace.

import { h } from './util.js';

const LIMIT = 3000;
const CONTEXT = 3;

export function lineDiff(before, after) {
  const a = splitLines(before);
  const b = splitLines(after);
  // Trim the common head and tail so the table only covers the changed middle.
  let head = 0;
  while (head < a.length && head < b.length && a[head] === b[head]) head++;
  let tail = 0;
  while (tail < a.length - head && tail < b.length - head && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++;
  const ops = a.slice(0, head).map((line) => ({ op: ' ', line }));
  const am = a.slice(head, a.length - tail);
  const bm = b.slice(head, b.length - tail);
  if (am.length > LIMIT || bm.length > LIMIT) {
    ops.push(...am.map((line) => ({ op: '-', line })), ...bm.map((line) => ({ op: '+', line })));
  } else {
    ops.push(...lcs(am, bm));
  }
  ops.push(...a.slice(a.length - tail).map((line) => ({ op: ' ', line })));
  return ops;
}

function splitLines(text) {
  const lines = String(text ?? '').split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  return lines;
}

function lcs(a, b) {
  const n = a.length;
  const m = b.length;
  const table = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      table[i][j] = a[i] === b[j] ? table[i + 1][j + 1] + 1 : Math.max(table[i + 1][j], table[i][j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) { out.push({ op: ' ', line: a[i] }); i++; j++; }
    else if (table[i + 1][j] >= table[i][j + 1]) { out.push({ op: '-', line: a[i] }); i++; }
    else { out.push({ op: '+', line: b[j] }); j++; }
  }
  while (i < n) out.push({ op: '-', line: a[i++] });
  while (j < m) out.push({ op: '+', line: b[j++] });
  return out;
}

export function diffStats(ops) {
  let added = 0;
  let removed = 0;
  for (const o of ops) {
    if (o.op === '+') added++;
    else if (o.op === '-') removed++;
  }
  return { added, removed };
}

// Unchanged runs longer than 2*CONTEXT+1 lines fold into one "… n unchanged lines" row.
export function renderDiff(ops) {
  const rows = [];
  let i = 0;
  while (i < ops.length) {
    if (ops[i].op !== ' ') {
      rows.push(row(ops[i]));
      i++;
      continue;
    }
    let j = i;
    while (j < ops.length && ops[j].op === ' ') j++;
    const run = ops.slice(i, j);
    const keepHead = i === 0 ? 0 : CONTEXT;
    const keepTail = j === ops.length ? 0 : CONTEXT;
    if (run.length > keepHead + keepTail + 1) {
      run.slice(0, keepHead).forEach((o) => rows.push(row(o)));
      rows.push(h('div', { class: 'diff-fold' }, `… ${run.length - keepHead - keepTail} unchanged lines`));
      run.slice(run.length - keepTail).forEach((o) => rows.push(row(o)));
    } else {
      run.forEach((o) => rows.push(row(o)));
    }
    i = j;
  }
  return h('div', { class: 'diff', role: 'table', 'aria-label': 'changes since the previous revision' }, rows);
}

function row(o) {
  const cls = o.op === '+' ? 'diff-add' : o.op === '-' ? 'diff-del' : 'diff-ctx';
  return h('div', { class: `diff-line ${cls}` }, h('span', { class: 'diff-op', 'aria-hidden': 'true' }, o.op), h('span', { class: 'diff-text' }, o.line || ' '));
}
