"""The linux plane's queue program without a fabric: clang's output is cached by content, a broken
program is one line naming clang's error, the settings reach the program's layout, and the htb
behind it gives each class the link's rate on its own."""

import pytest
from mrclab.controller import bpf, bpfmaps
from mrclab.controller.bpf import CFG, BpfError, PortConfig, compile_bpf, htb_lines
from mrclab.emulation import kernel, network
from mrclab.topologies.spec import LinkParams

needs_clang = pytest.mark.skipif(bpf.bpf_missing() is not None, reason=f"needs clang and libbpf: {bpf.bpf_missing()}")


@needs_clang
def test_the_program_compiles_once_per_content(tmp_path, monkeypatch):
    monkeypatch.setattr(bpf, "CACHE_ROOT", tmp_path)
    first = compile_bpf()
    stamp = first.stat().st_mtime_ns
    assert compile_bpf() == first and first.stat().st_mtime_ns == stamp  # from the cache
    changed = tmp_path / "port_queue.bpf.c"
    changed.write_text(bpf.SOURCE.read_text() + "\n/* changed */\n")
    assert compile_bpf(changed) != first  # another content, another entry
    assert not list(tmp_path.glob(".build-*"))  # nothing half-built left behind


@needs_clang
def test_a_program_clang_refuses_is_one_line_naming_the_error(tmp_path, monkeypatch):
    monkeypatch.setattr(bpf, "CACHE_ROOT", tmp_path / "cache")
    broken = tmp_path / "broken.bpf.c"
    broken.write_text(bpf.SOURCE.read_text().replace("struct port_cfg {", "struct port_cfg { int oops", 1))
    with pytest.raises(BpfError) as e:
        compile_bpf(broken)
    assert "clang failed on" in str(e.value) and "error" in str(e.value) and "\n" not in str(e.value)
    assert not list((tmp_path / "cache").glob("*.o")) and not list((tmp_path / "cache").glob(".build-*"))


def test_a_missing_clang_is_said_before_anything_is_built(monkeypatch):
    monkeypatch.setattr(bpf.shutil, "which", lambda _name: None)
    assert "clang is not installed" in bpf.bpf_missing()
    with pytest.raises(BpfError, match="clang is not installed"):
        compile_bpf()


def test_port_settings_pack_as_the_program_reads_them():
    cfg = PortConfig(rate_pps=212, ecn_k=8, trim_t=16, q_limit=32, loss=0.2, salt=-1, lossless=True, port_no=5,
                     frame_bytes=1178, watch_mbps=2.0, fifo=True)
    rate, k, t, limit, threshold, salt, lossless, port_no, frame, ps, fifo = CFG.unpack(cfg.pack())
    assert (rate, k, t, limit, lossless, port_no, frame, fifo) == (212, 8, 16, 32, 1, 5, 1178, 1)
    assert ps == 4_000_000  # a byte at 2 Mb/s: 4 us; the schedule adds a packet's bytes at it
    assert CFG.unpack(PortConfig().pack())[9:] == (0, 0)  # no schedule kept, not a FIFO
    assert threshold == round(0.2 * 65536) and salt == 0xFFFFFFFF  # a draw below it of 65536 drops
    assert CFG.unpack(PortConfig(loss=1.0).pack())[4] == 65536  # every packet


def test_each_htb_class_has_the_links_rate_on_its_own():
    lines = htb_lines("t0-0-0-eth3", 2.0, 40, 128)
    classes = [x for x in lines if x.startswith("class")]
    assert len(classes) == 2 and all("parent 1: " in x and "rate 2.0mbit ceil 2.0mbit" in x for x in classes)
    assert any("classid 1:10" in x and "prio 0" in x for x in classes)
    # the data class holds bytes, as the program's virtual queue counts them: 40 frames of 1,600
    assert any("bfifo limit 64000" in x and "parent 1:20" in x for x in lines)
    assert any("bfifo limit 64000" in x for x in htb_lines("t0-0-0-eth3", 2.0, 40, 128, frame_bytes=1000))
    assert any("bfifo limit 170000" in x for x in htb_lines("t0-0-0-eth3", 2.0, 40, 128, frame_bytes=4250))


def test_every_shaper_lets_the_runs_largest_frame_through():
    # tbf drops a frame larger than its burst: a fixed 3,000 bytes dropped every 4 KiB-payload frame
    # (4,250 bytes). The default payload's frames keep the 3,000-byte burst (two of them)
    import re

    def bursts(lines):
        return [int(b) for x in lines for b in re.findall(r"\bburst (\d+)", x)]

    assert bursts(htb_lines("t0-0-0-eth3", 2.0, 40, 128, lossless=True)) == [3000] * 3
    big = htb_lines("t0-0-0-eth3", 2.0, 40, 128, lossless=True, frame_bytes=4250)
    assert bursts(big) == [8500] * 3 and "limit 170000" in big[-1]  # 40 frames of 4,250 bytes
    assert kernel.tbf(1.5, 24000) == "tbf rate 1.5mbit burst 3000 limit 24000"
    assert kernel.tbf(1.5, 24000, 4250) == "tbf rate 1.5mbit burst 8500 limit 24000"
    assert network.nic_queue_bytes(LinkParams(bandwidth_mbps=1.5, queue_packets=16), 4250) == 16 * 4250


def test_the_asm_headers_are_found_without_gcc(tmp_path, monkeypatch):
    """A fresh Debian root has clang but no gcc: the multiarch include directory comes from
    Python's build or from the one triplet directory that holds asm/types.h, never from gcc."""
    monkeypatch.setattr(bpf.shutil, "which", lambda name: None if name == "gcc" else f"/usr/bin/{name}")
    (tmp_path / "aarch64-linux-gnu" / "asm").mkdir(parents=True)
    (tmp_path / "aarch64-linux-gnu" / "asm" / "types.h").write_text("")
    monkeypatch.setattr(bpf.sysconfig, "get_config_var", lambda _k: "aarch64-linux-gnu")
    assert bpf.asm_include_dir(tmp_path) == tmp_path / "aarch64-linux-gnu"
    monkeypatch.setattr(bpf.sysconfig, "get_config_var", lambda _k: None)  # a Python built without it
    assert bpf.asm_include_dir(tmp_path) == tmp_path / "aarch64-linux-gnu"
    (tmp_path / "x86_64-linux-gnu" / "asm").mkdir(parents=True)
    (tmp_path / "x86_64-linux-gnu" / "asm" / "types.h").write_text("")
    assert bpf.asm_include_dir(tmp_path) is None  # two candidates and no triplet: no guess
    assert bpf.asm_include_dir(tmp_path / "empty") is None


def _serve(requests: list[dict]) -> list[dict]:
    import io
    import json

    out = io.StringIO()
    bpfmaps.serve(io.StringIO("".join(json.dumps(r) + "\n" for r in requests)), out)
    return [json.loads(x) for x in out.getvalue().splitlines()]


def test_the_queue_agent_answers_each_request_with_one_line_and_errors_in_words(tmp_path):
    import base64

    target = tmp_path / "run" / "port_queue.o"
    got = _serve([{"op": "put", "path": str(target), "data": base64.b64encode(b"\x7fELF...").decode()},
                  {"op": "format_disk"},
                  {"op": "states", "items": [[str(tmp_path / "no-pins"), 3]]},
                  {"op": "configure", "pin": str(tmp_path / "no-pins")}])
    assert got[0] == {"ok": None} and target.read_bytes() == b"\x7fELF..."
    assert not list(target.parent.glob("*.part"))  # written whole, then named
    assert got[1] == {"error": "unknown request 'format_disk'"}
    # no pinned maps there (or no libbpf here): said, and the agent answers the next request
    assert "no map pinned at" in got[2]["error"] or "libbpf" in got[2]["error"]
    assert "error" in got[3]  # a request missing its arguments is an error line, not a dead agent


def test_the_queue_agent_is_the_standard_library_alone():
    # it runs on a server by its own source: nothing of mrclab (nor anything else) can be imported there
    import ast

    tree = ast.parse(bpf.Path(bpfmaps.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        (n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    import sys

    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_a_pfc_look_reads_the_feeders_only_where_the_agent_acts_on_them(monkeypatch):
    """The pause agent looks at every lossless port each millisecond: one map lookup a port (its
    state) unless the queue is at XOFF or held, where the feeders are read and cleared; below
    XOFF the program's bits accumulate in the map, and a queue seen empty has them cleared if a
    packet was queued since they last were."""
    import time

    m = bpfmaps.Maps(1, 2, 3, 4)
    store: dict = {}
    calls: list = []

    def lookup(fd, idx, size, flags=0):
        calls.append(("get", fd))
        return store.get((fd, idx))

    def update(fd, idx, value, flags, ok_exists=False):
        calls.append(("put", fd))
        store[(fd, idx)] = value

    monkeypatch.setattr(m, "_lookup", lookup)
    monkeypatch.setattr(m, "_update", update)
    later = time.monotonic_ns() + 10**12  # the program's last packet "after" now: nothing drained

    def queue(frames: int, low: int, feeds: int | None = None) -> None:
        store[(2, 7)] = bpfmaps.STATE.pack(0, 0, later, frames << bpfmaps.FP_SHIFT, 0, 0, 0, 0, low, 0, 0)
        if feeds is not None:
            store[(3, 7)] = bpfmaps.PFC.pack(feeds, 0, 0)

    def feeds_in_map() -> int:
        return bpfmaps.PFC.unpack(store[(3, 7)])[0]

    queue(3, low=5, feeds=0b110)
    assert m.pfc_look(7, 400, 8, held=False) == (3.0, 0)  # below XOFF: the bits stay in the map
    assert feeds_in_map() == 0b110
    calls.clear()
    assert m.pfc_look(7, 400, 8, held=False) == (3.0, 0)
    assert calls == [("get", 2)]  # one lookup: the state alone
    queue(9, low=9)
    assert m.pfc_look(7, 400, 8, held=False) == (9.0, 0b110)  # at XOFF: every feeder since, read...
    assert feeds_in_map() == 0  # ... and cleared
    queue(2, low=10, feeds=0b1)
    assert m.pfc_look(7, 400, 8, held=True) == (2.0, 0b1)  # held: read at any depth
    queue(0, low=11, feeds=0b1000)
    assert m.pfc_look(7, 400, 8, held=False) == (0.0, 0)
    assert feeds_in_map() == 0  # seen empty after a packet was queued: cleared
    store[(3, 7)] = bpfmaps.PFC.pack(0b1000, 0, 0)
    calls.clear()
    assert m.pfc_look(7, 400, 8, held=False) == (0.0, 0)
    assert calls == [("get", 2)] and feeds_in_map() == 0b1000  # nothing queued since: no write
