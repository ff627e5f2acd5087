"""Starting a 2-node DEX run by hand, as dexrun would, for the tests that
stand between its processes or beside them (malformed_peer, ucx_stranger,
no_open_agent, layout_mismatch, manual_launch), and reporting their checks."""
import socket
import struct
import subprocess

ENV = {"PATH": "/usr/bin:/bin", "GLIBC_TUNABLES": "glibc.pthread.rseq=0"}
HEADER = struct.Struct("<HHHHII")  # struct dex_msg_header
MAGIC, HELLO, PAGE_REQUEST = 0xDE58, 1, 3


def listener():
    """A listening socket on a free loopback port (the origin's, as dexrun passes it)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def start_node(argv, node, port, fd, secret, env=None, aslr_off=True, stdout=subprocess.PIPE,
               stderr=subprocess.PIPE):
    """Node `node` of 2 whose origin listens on `port`, with the listening
    socket passed as `fd`; `secret` is the run's key (None: left unset) and
    `env` adds variables. Run with ASLR off (setarch -R), as dexrun does,
    unless `aslr_off` is False."""
    full_env = dict(ENV, DEX_BOOT="node=%03d,nodes=002,port=%05d,fd=%04d,host=127.000.000.001" % (node, port, fd))
    if secret is not None:
        full_env["DEX_RUN_SECRET"] = secret
    full_env.update(env or {})
    prefix = ["setarch", "x86_64", "-R"] if aslr_off else []
    return subprocess.Popen(prefix + list(argv), env=full_env, pass_fds=(fd,), stdout=stdout, stderr=stderr,
                            text=True)


def wait_all(procs, timeout):
    """Their exit codes, or None (all killed) if one still runs after `timeout` s."""
    try:
        return [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return None


def wait_one(proc, timeout):
    """Its exit code, or None (killed) if it still runs after `timeout` s."""
    codes = wait_all([proc], timeout)
    return codes[0] if codes else None


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("connection closed after %d of %d bytes" % (len(data), n))
        data += chunk
    return data


def relay(src, dst):
    """Copies src to dst until either end closes, then shuts both down."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def pass_join(from_node, to_origin):
    """Passes a joining node's authentication (challenge, proof, answer),
    HELLO and WELCOME through a relay, as an attacker on the path could."""
    from_node.sendall(recv_exact(to_origin, 40))
    to_origin.sendall(recv_exact(from_node, 64))
    from_node.sendall(recv_exact(to_origin, 32))
    to_origin.sendall(recv_exact(from_node, HEADER.size + 80))
    from_node.sendall(recv_exact(to_origin, HEADER.size + 8))


def bogus_page_request():
    """A PAGE_REQUEST from node 1 naming an address no region contains."""
    body = struct.pack("<QII", 0x1000, 1, 0)
    return HEADER.pack(MAGIC, PAGE_REQUEST, 1, 0, len(body), 999) + body


def report(checks):
    """Prints one line per (name, passed) check; the exit status: 0 if all passed."""
    for name, passed in checks:
        print("%s %s" % ("ok  " if passed else "FAIL", name))
    return 0 if all(passed for _, passed in checks) else 1
