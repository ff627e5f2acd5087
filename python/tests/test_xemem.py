"""clowder.xemem: attach/make round trips between Python processes and between C and Python,
argument and bounds errors, no copy, detaching and freeing when the memory is released,
signals, snapshots, and the segment listing."""

import gc
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from clowder import xemem
from clowder.xemem.__main__ import main as xemem_main
from conftest import ROOT, child, finished


def mapped(address):
    """Whether `address` is inside a mapping of this process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= address < end:
                return True
    return False


def test_round_trip_between_two_python_processes():
    data = xemem.zeros(4096, dtype=np.int64)
    data[:] = np.arange(4096)
    segid = xemem.make(data, name=f"py-round-trip-{os.getpid()}")
    reader = child(f"""
        import numpy as np
        from clowder import xemem
        view = xemem.attach(xemem.lookup("py-round-trip-{os.getpid()}"), 4096 * 8, dtype=np.int64, writable=True)
        assert (view == np.arange(4096)).all(), view[:8]
        view[0] = -1                      # the owner sees it
        print("written")
        input()                           # the owner wrote too
        print(int(view[1]))
    """)
    assert reader.stdout.readline().strip() == "written"
    assert data[0] == -1
    data[1] = 1234
    reader.stdin.write("\n")
    assert finished(reader).strip() == "1234"
    xemem.remove(segid)


def test_c_owner_python_attacher(c_program):
    owner = subprocess.Popen([c_program("host_named_owner")], stdout=subprocess.PIPE, text=True)
    assert owner.stdout.readline().startswith("made a segment")
    view = xemem.attach(xemem.lookup("host-owner-seg"), 16 * 4096, dtype=np.uint64, writable=True)
    assert [int(view[page * 512]) for page in range(16)] == [2000 + page for page in range(16)]
    view[1] = 43  # the C owner waits for this word
    out, _ = owner.communicate(timeout=60)
    assert owner.returncode == 0 and "wrote 43" in out and "remove: 0" in out, out


def test_python_owner_c_attacher(c_program):
    data = xemem.zeros(16 * 512, dtype=np.uint64)
    data[::512] = 5000 + np.arange(16, dtype=np.uint64)
    segid = xemem.make(data)
    result = subprocess.run([c_program("host_segid_attacher"), str(segid)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert data[1] == 45  # the C attacher's store, in our memory
    xemem.remove(segid)


def test_no_copy_the_owners_later_stores_are_seen():
    data = xemem.zeros((64, 512), dtype=np.float64)
    segid = xemem.make(data)
    view = xemem.attach(segid, data.nbytes, dtype=np.float64).reshape(64, 512)
    assert not view.any()
    data[10, 7] = 2.5
    data[63, 511] = -1
    assert view[10, 7] == 2.5 and view[63, 511] == -1
    del view
    xemem.remove(segid)


def test_offsets_inside_and_across_pages():
    data = xemem.zeros(3 * 4096, dtype=np.uint8)
    data[:] = np.arange(data.size) % 251
    segid = xemem.make(data)
    for offset, nbytes in ((0, 1), (8, 16), (4095, 2), (4096, 4096), (5000, 7000)):
        view = xemem.attach(segid, nbytes, offset=offset)
        assert (view == data[offset:offset + nbytes]).all(), (offset, nbytes)
    as_int = xemem.attach(segid, 64, dtype=np.int32, offset=4096)
    assert (as_int == data[4096:4096 + 64].view(np.int32)).all()
    xemem.remove(segid)


def test_argument_errors_are_refused_before_any_call():
    with pytest.raises(ValueError, match="whole number of int64"):
        xemem.attach(1, 12, dtype=np.int64)
    with pytest.raises(ValueError, match="offset must be 0 or more"):
        xemem.attach(1, 8, offset=-8)
    with pytest.raises(ValueError, match="cannot live in shared memory"):
        xemem.attach(1, 8, dtype=object)
    with pytest.raises(ValueError, match="nbytes must be positive"):
        xemem.attach(1, 0)
    with pytest.raises(TypeError, match="segid is an int"):
        xemem.attach("1", 8)
    with pytest.raises(ValueError, match="not on a page boundary"):
        xemem.make(np.zeros(10000)[1:])
    with pytest.raises(ValueError, match="writable"):
        xemem.make(b"x" * 4096)
    with pytest.raises(ValueError, match="C-contiguous"):
        xemem.make(xemem.zeros((64, 64))[:, ::2])
    with pytest.raises(TypeError, match="buffer"):
        xemem.make(42)
    with pytest.raises(ValueError, match="printable ASCII"):
        xemem.make(xemem.zeros(8), name="has space")
    with pytest.raises(ValueError, match="printable ASCII"):
        xemem.lookup("x" * 64)


def test_libxpmem_errors_carry_errno_and_text():
    with pytest.raises(xemem.NotFoundError) as unknown:
        xemem.lookup(f"nobody-made-this-{os.getpid()}")
    assert unknown.value.errno == 2 and "look up" in str(unknown.value)
    data = xemem.zeros(4096, dtype=np.uint8)
    segid = xemem.make(data)
    with pytest.raises(xemem.XememError) as beyond:
        xemem.attach(segid, 4096, offset=4096)  # past the one-page segment
    assert beyond.value.errno == 22 and "attach 4096 bytes at offset 4096" in str(beyond.value)
    xemem.remove(segid)
    with pytest.raises(xemem.NotFoundError):
        xemem.attach(segid, 8)
    with pytest.raises(xemem.NotFoundError):
        xemem.remove(segid)


def test_read_only_attachments_refuse_stores():
    data = xemem.zeros(512, dtype=np.int64)
    segid = xemem.make(data)
    view = xemem.attach(segid, data.nbytes, dtype=np.int64)
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 1
    with pytest.raises(ValueError):
        view.flags.writeable = True
    del view
    writable = xemem.attach(segid, data.nbytes, dtype=np.int64, writable=True)
    writable[0] = 7  # the page was made writable again before the read-only mapping was let go
    assert data[0] == 7
    xemem.remove(segid)


def test_attachment_is_detached_when_its_last_array_goes():
    data = xemem.zeros(4096, dtype=np.uint8)
    segid = xemem.make(data)
    view = xemem.attach(segid, 4096)
    address = view.ctypes.data
    part = view[100:200].view(np.uint16)  # a view of a view keeps the memory
    del view
    gc.collect()
    assert mapped(address) and part[0] == 0
    del part
    gc.collect()
    assert not mapped(address)
    xemem.remove(segid)


def test_region_is_freed_when_its_last_array_goes():
    data = xemem.zeros((256, 256))
    address = data.ctypes.data
    row = data[3]
    del data
    gc.collect()
    assert mapped(address)
    del row
    gc.collect()
    assert not mapped(address)


def test_made_buffer_is_kept_until_removed():
    data = xemem.zeros(4096, dtype=np.uint8)
    address = data.ctypes.data
    segid = xemem.make(data)
    del data
    gc.collect()
    assert mapped(address)
    xemem.remove(segid)
    gc.collect()
    assert not mapped(address)


def test_signals_wake_the_owner():
    data = xemem.zeros(4096, dtype=np.uint8)
    segid = xemem.make(data, mode=0o600)
    assert xemem.wait(segid, timeout=0) == 0
    signaller = child(f"""
        from clowder import xemem
        xemem.signal({segid})
        xemem.signal({segid})
    """)
    finished(signaller)
    deadline = time.monotonic() + 10
    count = 0
    while count < 2 and time.monotonic() < deadline:
        count += xemem.wait(segid, timeout=1)
    assert count == 2
    assert isinstance(xemem.notify_fd(segid), int)
    xemem.remove(segid)
    with pytest.raises(xemem.NotFoundError):
        xemem.notify_fd(segid)


def test_snapshot_readers_see_their_version_while_the_writer_rewrites():
    field = xemem.zeros((256, 1024), dtype=np.float64)  # 2 MiB
    field[:] = 1.0
    with xemem.snapshot(field, name=f"py-snapshot-{os.getpid()}") as snap:
        reader = child(f"""
            import numpy as np
            from clowder import xemem
            view = xemem.attach(xemem.lookup("py-snapshot-{os.getpid()}"), 256 * 1024 * 8, dtype=np.float64)
            print(view.sum())
            input()                        # the writer rewrote everything
            print(view.sum())
        """)
        assert float(reader.stdout.readline()) == 256 * 1024
        field[:] = 2.0
        field[0, :10] = 5.0
        reader.stdin.write("\n")
        assert float(finished(reader)) == 256 * 1024  # still the snapshot's version
        assert field.sum() == 2.0 * (256 * 1024 - 10) + 50
        with pytest.raises(xemem.BusyError, match="a snapshot of this region is out"):
            xemem.snapshot(field)
    assert snap.released
    assert field.sum() == 2.0 * (256 * 1024 - 10) + 50
    with pytest.raises(xemem.NotFoundError):
        xemem.attach(snap.segid, 8)
    with xemem.snapshot(field[10:20]) as second:  # any view of the region; the new data
        view = xemem.attach(second.segid, field.nbytes, dtype=np.float64)
        field[:] = 3.0
        assert view[0] == 5.0 and view[-1] == 2.0
    with pytest.raises(ValueError, match="over a region"):
        xemem.snapshot(np.zeros(10))


def test_snapshot_released_when_garbage():
    field = xemem.zeros(4096, dtype=np.uint8)
    segid = xemem.snapshot(field).segid
    gc.collect()
    with pytest.raises(xemem.NotFoundError):
        xemem.attach(segid, 8)
    xemem.snapshot(field).release()  # the region takes snapshots again


class FakeDaemon:
    """A Unix socket that answers one request line with `reply`, recording the request."""

    def __init__(self, path, reply):
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        self.request = None
        self.thread = threading.Thread(target=self.serve, args=(reply,), daemon=True)
        self.thread.start()

    def serve(self, reply):
        connection, _ = self.server.accept()
        with connection:
            self.request = connection.makefile().readline()
            connection.sendall(reply)
        self.server.close()


def test_listing_segments_from_the_daemon(tmp_path, capsys):
    segments = [{"segid": 4294967297, "segid_hex": "0x100000001", "owner_enclave": 1, "owner_process": 77,
                 "size": 2 << 20, "name": "field"},
                {"segid": 8589934593, "segid_hex": "0x200000001", "owner_enclave": 2, "owner_process": None,
                 "size": None, "name": None}]
    path = str(tmp_path / "clowderd.sock")
    daemon = FakeDaemon(path, json.dumps({"ok": True, "socket": "x", "segments": segments}).encode() + b"\n")
    assert xemem_main(["ls", "--socket", path]) == 0
    assert json.loads(daemon.request) == {"op": "xemem_ls"}
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["SEGID", "NAME", "SIZE", "ENCLAVE", "PROCESS"]
    assert out[1].split() == ["0x100000001", "field", "2.0", "MiB", "1", "77"]
    assert out[2].split() == ["0x200000001", "-", "-", "2", "-"]


def test_listing_errors_are_one_line(tmp_path, capsys):
    path = str(tmp_path / "refusing.sock")
    FakeDaemon(path, b'{"ok": false, "kind": "unavailable", "error": "this server runs without an XEMEM broker"}\n')
    assert xemem_main(["ls", "--socket", path]) == 1
    assert capsys.readouterr().err == "clowder.xemem: clowderd refused xemem_ls: this server runs without an XEMEM broker\n"
    assert xemem_main(["ls", "--socket", str(tmp_path / "absent.sock")]) == 1
    assert "cannot reach clowderd at" in capsys.readouterr().err
    path = str(tmp_path / "garbled.sock")
    FakeDaemon(path, b"not json\n")
    with pytest.raises(xemem.DaemonError, match="not JSON"):
        xemem.list_segments(path)


def test_the_example_runs():
    example = os.path.join(ROOT, "examples", "xemem_insitu.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, example], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "in-situ example: every step's analytics read its snapshot unchanged"


def test_listing_a_real_daemons_segments(tmp_path):
    daemon = next((os.path.join(ROOT, "target", kind, "clowderd") for kind in ("release", "debug")
                   if os.path.exists(os.path.join(ROOT, "target", kind, "clowderd"))), None)
    if daemon is None:
        pytest.skip("clowderd is not built (make build)")
    api, broker = str(tmp_path / "clowderd.sock"), str(tmp_path / "xemem.sock")
    process = subprocess.Popen([daemon, "--config", "/dev/null", "--socket", api, "--xemem-socket", broker],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(broker):
            if process.poll() is not None:
                pytest.fail(f"clowderd ended: {process.stderr.read()}")
            assert time.monotonic() < deadline, "clowderd made no XEMEM socket in 20 s"
            time.sleep(0.05)
        owner = child(f"""
            import os
            os.environ["CLOWDER_XEMEM_SOCKET"] = {broker!r}  # this daemon's broker, not the suite's
            from clowder import xemem
            field = xemem.zeros(3 * 4096, dtype="u1")
            print(xemem.make(field, name="listed-field"))
            input()
        """)
        segid = int(owner.stdout.readline())
        listed = [s for s in xemem.list_segments(api) if s["name"] == "listed-field"]
        assert len(listed) == 1 and listed[0]["segid"] == segid and listed[0]["size"] == 3 * 4096, listed
        assert listed[0]["owner_process"] == owner.pid
        owner.stdin.write("\n")
        finished(owner)
    finally:
        process.terminate()
        process.wait(timeout=20)
