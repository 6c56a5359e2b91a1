"""The process a turn's sandboxed shells are started from, inside the sandbox (``tools/sandbox.py``).

Starting a bubblewrap sandbox costs ~5 ms of CPU here (namespaces, mounts, pivot), four times a
bash's start; paid for every call, it doubled the cost of a tool call when the model answers at
once. So each Bash tool starts one sandbox, running this file (``python -I -S``), and every
shell of its calls is a child of it: forked inside, already confined, for the cost of a bash.

It speaks to the host over one ``SOCK_SEQPACKET`` socket (the descriptor its argument names), a
message each:

    it sends      R                              ready
    host sends    S cwd NUL argc NUL argv… NUL env…   + 2 descriptors: the shell's stdin, its output
    it answers    P pid                          + the shell's pidfd (the host reads its own pid from it)
              or  E why                          the fork failed
    it sends      X pid NUL returncode           that shell has exited (reaped here: its parent)

Each shell is the leader of a new session (its process group is what the host kills), started
with ``posix_spawn``. When the
socket closes (the host is done, or gone) this program exits; bwrap's init then exits with it and
the kernel kills everything left in the sandbox's pid namespace.

Like ``reaper.py`` it starts on a turn's first call: a few built-in modules only, no pidesk import,
no ``__future__`` (the annotations evaluate on 3.11 as they are), and ``_socket`` rather than
``socket``, whose enums took 9 ms of the start here.
"""

import array
import os
import select
import sys
from _socket import CMSG_LEN, SCM_RIGHTS, SOL_SOCKET, socket

MAX_MESSAGE = 1 << 20


def recv_fds(sock: socket, size: int, most: int) -> tuple:
    """A message and the descriptors that came with it (``socket.recv_fds``, without ``socket``)."""
    fds = array.array("i")
    message, ancillary, _, _ = sock.recvmsg(size, CMSG_LEN(most * fds.itemsize))
    for level, kind, data in ancillary:
        if level == SOL_SOCKET and kind == SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return message, list(fds)


def send_fd(sock: socket, message: bytes, fd: int) -> None:
    sock.sendmsg([message], [(SOL_SOCKET, SCM_RIGHTS, array.array("i", [fd]))])


def spawn(cwd: str, argv: list, env: dict, stdin: int, output: int) -> int:
    """The shell, leading a session of its own, with ``stdin`` and ``output`` as its 0, 1 and 2 and no other
    descriptor of this program's (all are close-on-exec). ``posix_spawn``: a fork of even this small
    Python costs twice a vfork's time."""
    if os.getcwd() != cwd:
        os.chdir(cwd)
    return os.posix_spawn(argv[0], argv, env, setsid=True, file_actions=[
        (os.POSIX_SPAWN_DUP2, stdin, 0), (os.POSIX_SPAWN_DUP2, output, 1), (os.POSIX_SPAWN_DUP2, output, 2)])


def serve(sock: socket) -> None:
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    children: dict = {}  # pidfd -> pid
    sock.send(b"R")
    while True:
        for fd, _ in poll.poll():
            if fd != sock.fileno():  # a shell exited: reap it, say how
                info = os.waitid(os.P_PIDFD, fd, os.WEXITED)
                assert info is not None  # (no WNOHANG: it returned because the shell exited)
                poll.unregister(fd)
                os.close(fd)
                pid = children.pop(fd)
                code = -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status
                sock.send(b"X%d\0%d" % (pid, code))
                continue
            message, fds = recv_fds(sock, MAX_MESSAGE, 2)
            for passed in fds:
                os.set_inheritable(passed, False)
            if not message:
                return  # the host is done with this sandbox
            if message[:1] != b"S" or len(fds) != 2:
                for passed in fds:
                    os.close(passed)
                sock.send(b"Emalformed request")
                continue
            fields = message[1:].decode("utf-8", "surrogateescape").split("\0")
            argc = int(fields[1])
            argv, env = fields[2 : 2 + argc], dict(item.split("=", 1) for item in fields[2 + argc :] if "=" in item)
            try:
                pid = spawn(fields[0], argv, env, fds[0], fds[1])
                pidfd = os.pidfd_open(pid)
            except OSError as exc:
                sock.send(b"E" + str(exc).encode())
                continue
            finally:
                for passed in fds:
                    os.close(passed)
            children[pidfd] = pid
            poll.register(pidfd, select.POLLIN)
            send_fd(sock, b"P%d" % pid, pidfd)


if __name__ == "__main__":
    descriptor = int(sys.argv[1])
    os.set_inheritable(descriptor, False)
    channel = socket(fileno=descriptor)
    try:
        serve(channel)
    except (BrokenPipeError, ConnectionResetError):  # the host went away
        pass
    sys.exit(0)
