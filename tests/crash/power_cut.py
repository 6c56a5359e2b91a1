"""A lossy disk, the parent half: what a power cut leaves of what the child's journal says it did.

``Disk`` snapshots the watched trees before the child runs, replays the
journal of ``lossy_disk.py`` into a model of files (their bytes at the last
fsync, plus the unsynced writes and truncates since) and directories (their
entries at the last directory fsync, plus the unsynced creates, renames,
unlinks and mkdirs since), checks the model against the disk (``verify``: a
write that bypassed the layer fails the test, so the layer can never silently
record nothing), then writes a power cut's outcome over the real files
(``cut`` + ``apply``, by path):

- a file keeps its synced bytes and, per the policy, none of its unsynced
  operations (``drop``), all (``keep``), a prefix whose last write is torn at a
  byte (``torn``), or all of them with the written bytes replaced by zeros or
  random garbage (``zeros``, ``garbage``: the size reached the disk, the data
  blocks did not);
- a directory keeps its synced entries and a prefix, in order, of its unsynced
  entry operations (``none``, ``all``, or a random prefix): a file created or
  renamed there without a directory fsync afterwards may vanish, a rename may
  not have happened, an unlinked file may come back with its synced bytes.

Not modelled: SQLite's own files (trusted for their own durability; its VFS
cannot be intercepted through ``sqlite3``, so its WAL's unsynced tail is kept
whole), files written by tools or by code outside pidesk/store, reordering
between directories, a directory fsync that SQLite does for its own files, and
damage inside bytes that were synced.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lossy_disk import excluded

class ModelError(AssertionError):
    """The journal and the disk disagree: something wrote behind the layer's back."""


@dataclass(eq=False)
class Node:
    kind: str  # "file" | "dir"
    synced: Any  # bytes | dict[str, Node]: as of the last fsync
    now: Any  # bytearray | dict[str, Node]: as in the page cache
    ops: list[tuple[Any, ...]] = field(default_factory=list)  # unsynced since the last fsync, in order

    def sync(self) -> None:
        self.synced = bytes(self.now) if self.kind == "file" else dict(self.now)
        self.ops = []


def _apply_file(data: bytearray, op: tuple[Any, ...]) -> None:
    if op[0] == "w":
        _, off, chunk = op
        if len(data) < off:
            data.extend(bytes(off - len(data)))
        data[off:off + len(chunk)] = chunk
    else:
        del data[op[1]:]
        data.extend(bytes(max(0, op[1] - len(data))))


def _apply_dir(entries: dict[str, Node], op: tuple[Any, ...]) -> None:
    if op[0] == "link":
        entries[op[1]] = op[2]
    elif op[0] == "unlink":
        entries.pop(op[1], None)
    else:  # rename within the directory: atomic
        entries.pop(op[1], None)
        entries[op[2]] = op[3]


FILE_MODES = ("drop", "keep", "torn", "zeros", "garbage")
DIR_MODES = ("none", "all")  # "random": a random prefix of each directory's unsynced operations


@dataclass(frozen=True)
class Policy:
    """What a power cut keeps: ``file`` one of FILE_MODES or "random", ``dirs`` one of DIR_MODES or "random"."""

    file: str = "random"
    dirs: str = "random"
    seed: int = 0

    def describe(self) -> str:
        return f"files={self.file} dirs={self.dirs} seed={self.seed}"


@dataclass
class Cut:
    tree: dict[str, bytes | None]  # path -> bytes, or None for a directory
    lost: list[str]  # what the cut took, for failure messages


class Disk:
    """The parent's model of the watched trees: snapshot now, replay the child's journal later."""

    def __init__(self, roots: Sequence[Path], journal: Path, strict: Sequence[Path] = ()) -> None:
        self.journal = journal
        self.strict = [str(p) for p in strict]  # directories where every file on disk must be modelled
        self.roots: dict[str, Node] = {}
        self.inodes: dict[int, Node] = {}
        self.replayed = 0
        for root in roots:
            if root.is_dir():
                self.roots[str(root)] = self._snapshot(root)

    def _snapshot(self, path: Path) -> Node:
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode):
            entries = {e.name: self._snapshot(Path(e.path)) for e in os.scandir(path)
                       if not excluded(e.path) and not e.is_symlink()}
            node = Node("dir", dict(entries), entries)
        else:
            data = path.read_bytes()
            node = Node("file", data, bytearray(data))
        self.inodes[st.st_ino] = node
        return node

    # -- replay

    def replay(self) -> int:
        """Apply the journal's events not yet replayed; return how many there were."""
        lines = self.journal.read_bytes().split(b"\n") if self.journal.exists() else [b""]
        if lines[-1] != b"":
            raise ModelError(f"the journal {self.journal} ends in a torn line: the layer was killed mid-record")
        events = [json.loads(line) for line in lines[:-1]]
        for event in events[self.replayed:]:
            self._event(event)
        new = len(events) - self.replayed
        self.replayed = len(events)
        return new

    def _event(self, e: dict[str, Any]) -> None:
        op = e["op"]
        if op in ("create", "mkdir"):
            node = Node("file", b"", bytearray()) if op == "create" else Node("dir", {}, {})
            self.inodes[e["ino"]] = node
            parent = self._dir_at(os.path.dirname(e["path"]))
            if parent is None:  # its parent lies outside the model: a new root, durable as far as we care
                self.roots[e["path"]] = node
            else:
                self._dir_op(parent, ("link", os.path.basename(e["path"]), node))
        elif op in ("write", "trunc"):
            node = self._inode(e)
            change = ("w", e["off"], base64.b64decode(e["data"])) if op == "write" else ("t", e["size"])
            _apply_file(node.now, change)
            node.ops.append(change)
            if e["sync"]:
                node.sync()
        elif op == "fsync":
            self._inode(e).sync()
        elif op == "rename":
            src_dir, dst_dir = self._dir_at(os.path.dirname(e["src"])), self._dir_at(os.path.dirname(e["dst"]))
            if src_dir is None or dst_dir is None:
                raise ModelError(f"a rename outside the model: {e}")
            s, d = os.path.basename(e["src"]), os.path.basename(e["dst"])
            node = src_dir.now.get(s)
            if node is None:
                raise ModelError(f"rename of {e['src']}, which the model does not know")
            if src_dir is dst_dir:
                self._dir_op(src_dir, ("rename", s, d, node))
            else:  # not atomic across directories; pidesk does not do this
                self._dir_op(dst_dir, ("link", d, node))
                self._dir_op(src_dir, ("unlink", s))
        elif op == "unlink":
            parent = self._dir_at(os.path.dirname(e["path"]))
            if parent is None:
                raise ModelError(f"an unlink outside the model: {e}")
            self._dir_op(parent, ("unlink", os.path.basename(e["path"])))
        else:
            raise ModelError(f"unknown journal event {e}")

    def _inode(self, e: dict[str, Any]) -> Node:
        node = self.inodes.get(e["ino"])
        if node is None:
            raise ModelError(f"{e['op']} on inode {e['ino']}, which the model never saw created or snapshotted")
        return node

    @staticmethod
    def _dir_op(node: Node, op: tuple[Any, ...]) -> None:
        _apply_dir(node.now, op)
        node.ops.append(op)

    def _dir_at(self, path: str) -> Node | None:
        for root, top in self.roots.items():
            if path == root or path.startswith(root + os.sep):
                node: Node | None = top
                for name in Path(path).relative_to(root).parts:
                    node = node.now.get(name) if node is not None and node.kind == "dir" else None
                return node if node is not None and node.kind == "dir" else None
        return None

    # -- views

    def _tree(self, entries: Callable[[Node], dict[str, Node]], content: Callable[[Node], bytes]) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}

        def walk(path: str, node: Node) -> None:
            if node.kind == "dir":
                out[path] = None
                for name, child in entries(node).items():
                    walk(os.path.join(path, name), child)
            else:
                out[path] = content(node)

        for root, node in self.roots.items():
            walk(root, node)
        return out

    def now(self) -> dict[str, bytes | None]:
        """The watched trees as the page cache holds them (what a SIGKILL leaves)."""
        return self._tree(lambda n: n.now, lambda n: bytes(n.now))

    def unsynced(self) -> dict[str, int]:
        """Path -> how many unsynced operations a power cut could take there (files and directories)."""
        return {path: len(node.ops) for path, node in self._nodes() if node.ops}

    def _nodes(self) -> list[tuple[str, Node]]:
        """Every node reachable by a synced or a page-cache entry, once, at the first path found."""
        out: list[tuple[str, Node]] = []
        seen: set[int] = set()

        def walk(path: str, node: Node) -> None:
            if id(node) in seen:
                return
            seen.add(id(node))
            out.append((path, node))
            if node.kind == "dir":
                for name, child in {**node.synced, **node.now}.items():
                    walk(os.path.join(path, name), child)

        for root, node in self.roots.items():
            walk(root, node)
        return out

    def verify(self) -> None:
        """The model's page cache must be the disk: every modelled byte, and nothing unmodelled where it is strict."""
        now = self.now()
        for path, data in now.items():
            if data is None:
                if not os.path.isdir(path):
                    raise ModelError(f"the model has a directory {path} the disk does not")
            elif not os.path.isfile(path) or Path(path).read_bytes() != data:
                raise ModelError(f"{path} differs from the journal's replay: something wrote it behind the layer")
            if data is None and any(path == s or path.startswith(s + os.sep) for s in self.strict):
                unknown = {e.name for e in os.scandir(path)} - {n for n in self._names(path)}
                if unknown:
                    raise ModelError(f"files in {path} the layer never saw created: {sorted(unknown)}")

    def _names(self, path: str) -> Iterable[str]:
        node = self._dir_at(path)
        return node.now.keys() if node is not None else ()

    # -- the power cut

    def cut(self, policy: Policy) -> Cut:
        """Choose, per the policy, what of each unsynced operation survives; nothing is written yet."""
        rng = random.Random(policy.seed)
        lost: list[str] = []
        chosen_files: dict[int, bytes] = {}
        chosen_dirs: dict[int, dict[str, Node]] = {}
        paths = {id(n): p for p, n in self._nodes()}

        def entries(node: Node) -> dict[str, Node]:
            if id(node) not in chosen_dirs:
                if policy.dirs == "random":
                    keep = rng.randint(0, len(node.ops))
                else:
                    keep = {"none": 0, "all": len(node.ops)}[policy.dirs]
                out = dict(node.synced)
                for op in node.ops[:keep]:
                    _apply_dir(out, op)
                if keep < len(node.ops):
                    lost.append(f"{paths.get(id(node), '?')}: dir kept {keep} of {len(node.ops)} unsynced ops "
                                f"{[op[:3] if op[0] == 'rename' else op[:2] for op in node.ops]}")
                chosen_dirs[id(node)] = out
            return chosen_dirs[id(node)]

        def content(node: Node) -> bytes:
            if id(node) not in chosen_files:
                mode = policy.file if policy.file != "random" else rng.choice(FILE_MODES)
                data = self._file_after(node, mode, rng)
                if node.ops and data != bytes(node.now):
                    lost.append(f"{paths.get(id(node), '?')}: {mode}, {len(node.synced)} synced bytes, "
                                f"{len(node.now)} in the page cache, {len(data)} survive")
                chosen_files[id(node)] = data
            return chosen_files[id(node)]

        return Cut(self._tree(entries, content), lost)

    @staticmethod
    def _file_after(node: Node, mode: str, rng: random.Random) -> bytes:
        data = bytearray(node.synced)
        ops = node.ops
        if mode == "keep":
            ops_kept = ops
        elif mode == "drop" or not ops:
            ops_kept = []
        elif mode == "torn":
            i = rng.randrange(len(ops))
            ops_kept = list(ops[:i])
            if ops[i][0] == "w" and len(ops[i][2]) > 1:
                _, off, chunk = ops[i]
                ops_kept.append(("w", off, chunk[: rng.randint(1, len(chunk) - 1)]))
        elif mode in ("zeros", "garbage"):
            def filler(n: int) -> bytes:
                return bytes(n) if mode == "zeros" else bytes(rng.getrandbits(8) for _ in range(n))
            ops_kept = [("w", op[1], filler(len(op[2]))) if op[0] == "w" else op for op in ops]
        else:
            raise ValueError(f"unknown file mode {mode!r}; one of {FILE_MODES}")
        for op in ops_kept:
            _apply_file(data, op)
        return bytes(data)

    def apply(self, cut: Cut) -> None:
        """Make the disk what the cut left: remove what vanished, write what survived (by path)."""
        now = self.now()
        for path in sorted(now, key=lambda p: -p.count(os.sep)):
            if path in cut.tree and (cut.tree[path] is None) == (now[path] is None):
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.unlink(path)
        for path in sorted(cut.tree, key=lambda p: p.count(os.sep)):
            data = cut.tree[path]
            if data is None:
                os.makedirs(path, exist_ok=True)
            elif not os.path.isfile(path) or Path(path).read_bytes() != data:
                Path(path).write_bytes(data)

    def power_cut(self, policy: Policy) -> Cut:
        """Replay, verify, cut and apply in one step."""
        self.replay()
        self.verify()
        cut = self.cut(policy)
        self.apply(cut)
        return cut
