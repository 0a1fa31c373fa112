"""The fact registry (k2provision.core.facts.FACT_COMMANDS): each fact's command, run for real on
this machine where it exists, gives output its parser reads; several commands for one fact
fall back in order; what a run leaves to parse follows the exit status."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from k2provision.core import role_specs
from k2provision.core.expectations import FACT_TEXTS, host_facts
from k2provision.core.facts import (
    DEFAULT_DIAG_LEVEL,
    DIAG_LEVELS,
    FACT_COMMANDS,
    FACTS,
    MODEL_DIR,
    HostFacts,
)

ROOT = Path(__file__).resolve().parents[3]
HW = ROOT / "tests" / "fixtures" / "hardware"


def test_keys_are_unique_and_fill_host_facts() -> None:
    assert len(FACTS) == len(FACT_COMMANDS) == len(FACT_TEXTS)
    fields = set(HostFacts.model_fields) - {"host"}
    assert {fact.field for fact in FACT_COMMANDS} == fields


def test_the_model_dir_is_put_into_the_command() -> None:
    argv = FACTS["df_avail"].command("/models/Kimi-K2-Instruct")
    assert MODEL_DIR not in argv
    assert argv[-1] == "/models/Kimi-K2-Instruct"
    assert FACTS["ss"].command("/x") == ["ss", "-Hltn"]


def test_what_a_run_leaves_to_parse() -> None:
    assert FACTS["uname"].text(0, "6.8.0\n") == "6.8.0\n"
    assert FACTS["uname"].text(1, "6.8.0\n") is None
    assert FACTS["uname"].text(0, "  \n") is None
    # No listener is an answer; an inactive unit's word is the fact whatever the exit status.
    assert FACTS["ss"].text(0, "") == ""
    assert FACTS["fabric_manager"].text(3, "inactive\n") == "inactive\n"
    assert FACTS["fabric_manager"].text(4, "") is None


@pytest.mark.parametrize("key", [f.key for f in FACT_COMMANDS if not f.hardware])
def test_each_command_run_here_leaves_text_its_parser_reads(key: str, tmp_path: Path) -> None:
    """Not a hardware fact: run here for real, the command leaves nothing (it is missing or
    fails, as a shell reports it) or output that parses."""
    fact = FACTS[key]
    argv = fact.command(str(tmp_path / "models" / "K2"))
    if shutil.which(argv[0]) is None:
        done = subprocess.run(["sh", "-c", '"$@"', "sh", *argv], capture_output=True, text=True)
        assert done.returncode == 127
    else:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    text = fact.text(done.returncode, done.stdout)
    if text is not None:
        fact.parse(text)
    else:
        assert done.returncode != 0 or not done.stdout.strip()


def test_the_commands_every_debian_host_has_give_their_facts(tmp_path: Path) -> None:
    model_dir = str(tmp_path / "models" / "K2")
    texts = {}
    for key in ("df_avail", "du_model_dir", "ss", "os_release", "uname"):
        done = subprocess.run(FACTS[key].command(model_dir), capture_output=True, text=True)
        texts[key] = FACTS[key].text(done.returncode, done.stdout)
    facts, problems = host_facts("here", texts)
    assert problems == []
    assert facts.model_dir_free_bytes is not None
    assert facts.model_dir_free_bytes > 0
    assert facts.model_dir_used_bytes == 0  # the model dir does not exist yet
    assert facts.listening is not None
    assert facts.os is not None
    assert facts.kernel is not None


def test_chrony_answers_where_timedatectl_cannot_tell() -> None:
    chrony = (HW / "dev-host" / "chronyc-tracking-unsynced.txt").read_text()
    facts, problems = host_facts("h", {"clock": "Timezone=UTC\n", "clock_chrony": chrony})
    assert problems == []
    assert facts.clock is not None
    assert facts.clock.source == "chrony"
    assert not facts.clock.synchronized


def test_timedatectl_wins_when_it_answers() -> None:
    chrony = (HW / "dev-host" / "chronyc-tracking-unsynced.txt").read_text()
    facts, _ = host_facts("h", {"clock": "NTPSynchronized=yes\n", "clock_chrony": chrony})
    assert facts.clock is not None
    assert (facts.clock.source, facts.clock.synchronized) == ("timedatectl", True)


def test_output_no_command_of_a_fact_can_read_is_named_once() -> None:
    facts, problems = host_facts("h", {"clock": "Timezone=UTC\n", "du_model_dir": "oops\n"})
    assert facts.clock is None
    assert [p.check for p in problems] == ["unreadable_du_model_dir", "unreadable_clock"]
    assert problems[1].line() == (
        "h: cannot read the output of `timedatectl show`: clock: no NTPSynchronized=, "
        "'System clock synchronized:' or 'Leap status' line; fix: run `timedatectl show` on the "
        "host and check its output"
    )


@pytest.mark.parametrize("level", DIAG_LEVELS)
def test_the_dcgm_diagnostic_runs_at_the_level_asked(level: int) -> None:
    assert FACTS["dcgm_diag"].command("/x", level) == ["dcgmi", "diag", "-r", str(level), "-j"]
    assert FACTS["dcgm_diag"].command("/x")[3] == str(DEFAULT_DIAG_LEVEL) == "1"


@pytest.mark.parametrize("level", [0, 5, -1])
def test_a_dcgm_level_outside_1_to_4_is_refused(level: int) -> None:
    with pytest.raises(ValueError, match=f"level {level}; expected one of 1, 2, 3, 4"):
        FACTS["dcgm_diag"].command("/x", level)


def test_the_inventory_sets_the_dcgm_level_within_1_to_4() -> None:
    name = "k2_preflight_dcgm_diag_level"
    assert role_specs.default(name) == DEFAULT_DIAG_LEVEL
    assert role_specs.value_problem(name, 3) is None
    problem = role_specs.value_problem(name, 5)
    assert problem is not None
    assert "1, 2, 3, 4" in problem
