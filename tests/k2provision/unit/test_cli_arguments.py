"""Every bad command-line argument: exit 2, the problem named, the command's usage shown, and
nothing read or contacted first (the inventory is a valid one; the host trap watches)."""

from __future__ import annotations

import pytest

from tests.golden_cases import GOLDEN
from tests.k2provision.unit.contract_support import HostTrap

INV = str(GOLDEN / "sglang-tp" / "inventory.ini")
HUGE = "9" * 20

# (command line, what the error names)
BAD: list[tuple[list[str], str]] = [
    (["models", "--context-length", HUGE], f"--context-length {HUGE}"),
    (["models", "--context-length", "0"], "--context-length 0"),
    (["models", "--gpu", "zz"], "--gpu zz"),
    (["models", "--format", "xml"], "'xml' is not one of"),
    (["plan", INV, "--format", "xml"], "'xml' is not one of"),
    (["render", INV, "--out", ""], "--out ''"),
    (["logs", INV, "--tail", "-1"], "--tail -1"),
    (["logs", INV, "--tail", HUGE], f"--tail {HUGE}"),
    (["logs", INV, "--tail", "many"], "'many' is not a valid integer"),
    (["logs", INV, "--since", "bogus"], "--since bogus"),
    (["logs", INV, "--grep", "("], "--grep ("),
    (["status", INV, "--watch", "-1"], "--watch -1"),
    (["status", INV, "--watch", "nan"], "--watch nan"),
    (["status", INV, "--watch", "inf"], "--watch inf"),
    (["bench", INV, "--num-prompts", "0"], "--num-prompts 0"),
    (["bench", INV, "--num-prompts", HUGE], f"--num-prompts {HUGE}"),
    (["bench", INV, "--gpu-hour-price", "-1"], "--gpu-hour-price -1"),
    (["bench", INV, "--gpu-hour-price", "nan"], "--gpu-hour-price nan"),
    (["bench", INV, "--gpu-hour-price", "inf"], "--gpu-hour-price inf"),
    (["bench", INV, "--workload", "bogus"], "--workload 'bogus'"),
    (["bench", INV, "--workload", "custom", "--input-len", "8"], "--output-len"),
    (["bench", INV, "--workload", "custom", "--input-len", "0", "--output-len", "1"],
     "--input-len 0"),
    (["bench", INV, "--workload", "custom", "--input-len", HUGE, "--output-len", "1"],
     f"--input-len {HUGE}"),
    (["bench", INV, "--concurrency", "a,b"], "--concurrency 'a,b'"),
    (["bench", INV, "--concurrency", "0"], "--concurrency '0'"),
    (["apply", INV, "--no-such-option"], "No such option"),
    (["stop", INV, "--bogus"], "No such option"),
    (["verify", INV, "extra-argument"], "unexpected extra argument"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "named"), BAD, ids=[" ".join(b[0][::2])[:40] for b in BAD])
def test_a_bad_argument_is_exit_2_with_the_usage(
    host_trap: HostTrap, argv: list[str], named: str
) -> None:
    code, out, err, unexpected = host_trap.run(*argv)
    assert unexpected is None, unexpected
    assert code == 2, (out, err)
    assert out == ""
    assert named in err, err
    assert "Usage: " in err, err
    assert f" {argv[0]} [OPTIONS]" in err, err
    assert "Traceback" not in err


def test_every_command_with_numeric_or_choice_options_is_covered() -> None:
    assert {b[0][0] for b in BAD} >= {"models", "plan", "render", "logs", "status", "bench"}
