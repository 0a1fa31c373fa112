"""The benchmarks' own rules, without a lab: a run that is not ok gives no figure and the
script exits non-zero; the scratch space holds what a chain run writes; where a chain run's
time goes and how busy the machine was are read correctly."""

from __future__ import annotations

import io

import pytest

from benchmarks import weights_broadcast as wb
from benchmarks.outcome import NotOk, Outcome, run
from benchmarks.relay_harness import BroadcastResult, FileFailure, HostResult, RelayEvent, failure

# ----------------------------------------------------------------------------- the rule


def test_an_outcome_with_every_run_ok_exits_0_and_says_nothing() -> None:
    out = io.StringIO()
    assert Outcome(out=out).finish() == 0
    assert out.getvalue() == ""


def test_a_run_that_is_not_ok_is_named_with_its_reason_and_the_exit_is_1() -> None:
    out = io.StringIO()
    outcome = Outcome(out=out)
    outcome.not_ok("N=4 chain", "4 of 4 hosts not ok")
    assert outcome.finish() == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == "NOT OK: N=4 chain: 4 of 4 hosts not ok"
    assert lines[-1] == "NOT OK: 1 run(s) gave no figure: N=4 chain"


def test_a_benchmark_that_stops_on_not_ok_prints_it_and_exits_1() -> None:
    def stops() -> int:
        raise NotOk("raw chain: h2 moved 10 of 20 bytes")

    out = io.StringIO()
    assert run(stops, out=out) == 1
    assert out.getvalue() == "NOT OK: raw chain: h2 moved 10 of 20 bytes\n"
    assert run(lambda: 0, out=out) == 0


def result(*statuses: str, seed: str = "ok", seconds: float = 10.0) -> BroadcastResult:
    hosts = tuple(
        HostResult(
            name=f"h{i}",
            address=f"10.97.0.{10 + i}",
            status=status,
            failed=(FileFailure(name="model-1-of-2.safetensors", reason="No space left"),)
            if status != "ok"
            else (),
            cpu={"process_user": 1.0, "process_sys": 0.5},
        )
        for i, status in enumerate(statuses, start=1)
    )
    return BroadcastResult(mode="chain", seconds=seconds, files=2, manifest_bytes=10 << 20,
                           bytes_sent=10 << 20, seed_status=seed, hosts=hosts,
                           seed_cpu={"process_user": 0.5})  # fmt: skip


def a_run(res: BroadcastResult, waited: float = 0.0) -> wb.Run:
    return wb.Run(res, [], 1000.0, busy=0.5, load=1.0, waited={"h1": waited, "seed": 0.0})


def test_failure_names_the_bad_hosts_and_why() -> None:
    assert failure(result("ok", "ok")) == ""
    reason = failure(result("ok", "incomplete", seed="incomplete"))
    assert reason.startswith("seed incomplete; ")
    assert "1 of 2 hosts not ok (h2 incomplete: model-1-of-2.safetensors: No space left)" in reason


def test_a_not_ok_run_prints_no_figure_and_gets_no_table_row() -> None:
    out = io.StringIO()
    outcome = Outcome(out=out)
    bad = a_run(result("incomplete", "incomplete", seconds=32.0))
    row = wb.report(4, "chain", 100.0, 400_000_000, bad, wb.verdict(bad, 0.05), outcome)
    good = a_run(result("ok", seconds=32.0))
    fan = wb.report(4, "fanout", 100.0, 100_000_000, good, wb.verdict(good, 0.05), outcome)
    text = out.getvalue()
    assert text.splitlines()[0].startswith("NOT OK: N=4 chain: ")
    assert "efficiency" not in row
    assert not row["ok"]
    # The fan-out's figure is there (100 MB at 100 Mbit/s in 32 s: 8/32), the chain's is not.
    assert fan["efficiency"] == pytest.approx(0.25)
    assert f"{400 / 100 * 8 / 32:.3f}" not in text
    assert "0.250" in text
    assert wb.markdown_table([row, fan]) == []
    assert outcome.finish() == 1


def test_an_ok_pair_gives_one_table_row() -> None:
    out = io.StringIO()
    outcome = Outcome(out=out)
    chain = wb.report(4, "chain", 100.0, 400_000_000, a_run(result("ok", seconds=34.0)), "",
                      outcome)  # fmt: skip
    fan = wb.report(4, "fanout", 100.0, 100_000_000, a_run(result("ok", seconds=34.0)), "",
                    outcome)  # fmt: skip
    table = wb.markdown_table([chain, fan])
    assert table[-1] == "| 4 | 100.0 | 0.941 | 0.235 | 0.94 | 4.00x |"
    assert outcome.finish() == 0


def test_a_run_whose_relay_waited_for_a_core_is_machine_bound() -> None:
    ok = result("ok", seconds=10.0)
    assert wb.verdict(a_run(ok, waited=0.4), 0.05) == ""
    why = wb.verdict(a_run(ok, waited=0.6), 0.05)
    assert why.startswith("machine-bound: ")
    assert "h1 waited longest for a core: 6.0% of the run" in why


# ----------------------------------------------------------------------------- scratch


def test_a_chain_run_needs_the_source_and_n_copies() -> None:
    # 1.07 GB at N=4 does not fit a 4 GB tmpfs: five copies are 5.35 GB.
    need = wb.scratch_bytes({4: 1_070_000_000})
    assert need >= 5 * 1_070_000_000
    assert need > 4e9
    # The largest (N + 1) x set decides, not the largest N.
    assert wb.scratch_bytes({4: 1_000_000_000, 32: 10_000_000}) == wb.scratch_bytes(
        {4: 1_000_000_000}
    )


@pytest.mark.parametrize("n", [4, 8, 16, 32])
def test_the_rate_is_lowered_until_the_set_fits_the_space(n: int) -> None:
    space = 4e9
    common = {"write_bps": 2.5e9, "hash_bps": 2e9, "max_mbit": 10_000.0, "disk_share": 0.5,
              "cpu_share": 4.0, "seconds": 30.0}  # fmt: skip
    free = wb.pick_mbit(n, **common)
    fitted = wb.pick_mbit(n, space=space, **common)
    assert wb.scratch_bytes({n: wb.set_bytes(free, 30.0)}) > space  # the unbounded rate would not
    assert fitted < free
    assert wb.scratch_bytes({n: wb.set_bytes(fitted, 30.0)}) <= space


def test_the_rate_is_the_lowest_of_disk_cpu_and_cap() -> None:
    common = {"hash_bps": 1e9, "disk_share": 0.5, "cpu_share": 0.4, "seconds": 30.0}
    # disk: 0.5 * 400 MB/s / 4 = 50 MB/s = 400 Mbit/s; cpu: 0.4 * 1 GB/s / (4 * 4) = 200 Mbit/s
    assert wb.pick_mbit(4, write_bps=400e6, max_mbit=1000.0, **common) == pytest.approx(200.0)
    assert wb.pick_mbit(4, write_bps=100e6, max_mbit=1000.0, **common) == pytest.approx(100.0)
    assert wb.pick_mbit(4, write_bps=400e6, max_mbit=50.0, **common) == pytest.approx(50.0)


def test_memory_available_is_read_from_meminfo() -> None:
    text = "MemTotal:       24684132 kB\nMemFree: 1 kB\nMemAvailable:   23000000 kB\n"
    assert wb.mem_available(text) == 23000000 * 1024
    with pytest.raises(ValueError, match="MemAvailable"):
        wb.mem_available("MemTotal: 1 kB\n")


# ----------------------------------------------------------------------------- the machine


def test_busy_share_counts_everything_but_idle_and_iowait() -> None:
    before = wb.cpu_times("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n")
    after = wb.cpu_times("cpu  250 0 150 800 100 0 0 0 0 0\n")
    assert before == (200, 1000)
    assert wb.busy_share(before, after) == pytest.approx(200 / 300)
    assert wb.busy_share(after, after) == 0.0


def test_schedstat_wait_is_the_second_field_in_seconds() -> None:
    assert wb.schedstat_wait("5000000000 1500000000 42\n") == pytest.approx(1.5)


# ----------------------------------------------------------------------------- phases


def event(source: str, kind: str, t: float, **data: int) -> RelayEvent:
    return RelayEvent(source=source, event=kind, data={"t": t, **data})


def test_phases_split_a_chain_run_at_link_seed_first_tail_byte_and_last_seed_byte() -> None:
    link = 1_000_000.0  # bytes/s
    total = 10_000_000
    events = [
        event("seed", "plan", 100.5),
        event("seed", "progress", 101.0, tx=500_000),
        event("h4", "progress", 101.0, rx=200_000),  # first byte at 101.0 - 0.2 = 100.8
        event("seed", "progress", 105.0, tx=4_500_000),
        event("h4", "progress", 105.0, rx=4_200_000),
        event("seed", "progress", 110.0, tx=9_500_000),
        event("h4", "progress", 110.0, rx=9_200_000),
        event("seed", "progress", 111.0, tx=total),  # last byte at 110.0 + 0.5 = 110.5
        event("h4", "progress", 111.0, rx=total),
    ]
    ph = wb.phases(events, "h4", 100.0, 112.0, total, link)
    assert ph is not None
    assert ph.forming == pytest.approx(0.5)
    assert ph.filling == pytest.approx(0.3, abs=1e-3)
    assert ph.steady == pytest.approx(9.7, abs=1e-3)
    assert ph.draining == pytest.approx(1.5)
    assert ph.forming + ph.filling + ph.steady + ph.draining == pytest.approx(12.0)
    # The last host got 5 MB in 5 s from 105 to 110: the link's rate.
    assert ph.tail_rate == pytest.approx(1.0)


def test_phases_of_a_run_whose_seed_never_sent_it_all_are_unknown() -> None:
    events = [
        event("seed", "plan", 100.5),
        event("seed", "progress", 101.0, tx=500),
        event("h4", "progress", 101.0, rx=200),
    ]
    assert wb.phases(events, "h4", 100.0, 112.0, 10_000, 1000.0) is None
