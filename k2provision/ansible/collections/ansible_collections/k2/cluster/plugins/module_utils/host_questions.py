"""The questions k2provision asks a host: one registry (standard library only, Python 3.9+).

Each question is a frozen dataclass that knows its shell command and reads that command's
answer into a typed record: a container's state and spec label, an exec'd process's
liveness, what a health gate answers (an https one checked by the one certificate policy,
:data:`HTTP_PROBE`), a log's tail, a file's digest and mode, the host's clock, a tool's
output. Whoever asks, asks through here: the launch gate and ``status``/``logs`` send a
:class:`Batch`'s script over SSH (one round trip per host) and read its answer; the look
module (``host_look``) runs the same script on the host itself (:func:`ask_here`) and sends
the records back as JSON (:func:`record_json`); nothing else builds these commands or reads
their output.

It lives in the collection's module_utils because AnsiballZ carries only module_utils to a
host (see ``k2_weights``'s docstring); the controller imports it by its package path.

A batch's answer, per question::

    @@k2 q KEY
    |a line of the command's stdout
    @@k2 err
    |a line of its stderr
    @@k2 rc N

and ``@@k2 end`` last (an answer without it was cut short). Every output line is behind
``|``, so no line a command prints reads as a marker.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import socket
import subprocess
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Optional, TypeVar

MARK = "@@k2"
ANSWER_TIMEOUT_S = 5
"""How long a health gate's one answer may take (an HTTP GET, a command in the container)."""
STARTING_STATES = frozenset({"created", "configured", "initialized"})
"""Container states that mean "not started yet" rather than "gone"."""

HTTP_PROBE = (
    "import os, ssl, sys, urllib.request as u\n"
    "url, timeout, ca = sys.argv[1], float(sys.argv[2]), sys.argv[3]\n"
    "c = ssl.create_default_context()\n"
    "if ca and os.path.isfile(ca):\n"
    "    c.load_verify_locations(ca)\n"
    "try:\n"
    "    print(u.urlopen(url, timeout=timeout, context=c).status)\n"
    "except u.HTTPError as e:\n"
    "    print(e.code)\n"
    "except Exception as e:\n"
    "    r = getattr(e, 'reason', e)\n"
    "    if isinstance(r, ssl.SSLCertVerificationError):\n"
    "        print('untrusted', r.verify_message or r)\n"
    "    else:\n"
    "        print('no answer', r)\n"
)
"""The one certificate policy of every https question: the certificate must be trusted by
the host's system store or by the CA file the question names (the plan's private CA where
the launch placed one), for the URL's host name. A plain http URL is asked as it is. A
certificate that fails the check answers `untrusted <why>`: the server answers, but no wait
makes it pass."""


HTTP_BODY_PROBE = (
    "import sys, urllib.request as u\n"
    "url, timeout, key = sys.argv[1], float(sys.argv[2]), sys.argv[3]\n"
    "h = {}\n"
    "try:\n"
    "    with open(key) as f:\n"
    "        h['Authorization'] = 'Bearer ' + f.read().strip()\n"
    "except OSError:\n"
    "    pass\n"
    "try:\n"
    "    print(u.urlopen(u.Request(url, headers=h), timeout=timeout).read().decode())\n"
    "except Exception as e:\n"
    "    print('no answer', getattr(e, 'reason', e))\n"
)
"""What a plain http URL on the host's private network answers (a GET), sent with the bearer
key in `key` where that file exists (read there, never on a command line)."""

HAPROXY_PROBE = (
    "import socket, sys\n"
    "c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "c.settimeout(float(sys.argv[3]))\n"
    "try:\n"
    "    c.connect(sys.argv[1])\n"
    "    c.sendall(sys.argv[2].encode() + b'\\n')\n"
    "    while True:\n"
    "        b = c.recv(65536)\n"
    "        if not b:\n"
    "            break\n"
    "        sys.stdout.write(b.decode(errors='replace'))\n"
    "except Exception as e:\n"
    "    print('no answer', e)\n"
)
"""One command to HAProxy's runtime API (its admin UNIX socket), and its reply; the same
exchange as :func:`haproxy_ask`, as a script a batch runs."""


def haproxy_ask(path: str, command: str, timeout_s: float = 10) -> str:
    """One command to HAProxy's runtime API at `path`; its reply (HAProxy closes after it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(path)
        conn.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


@dataclass(frozen=True)
class BackendServer:
    """One server of an HAProxy backend, as ``show stat`` reports it."""

    name: str
    status: str
    """UP, DOWN, DRAIN, MAINT, or a transition (``UP 1/2``)."""
    sessions: int
    """Requests in flight through it."""
    requests: int = 0
    """Requests HAProxy sent it since it started (stot; health checks are not counted)."""
    errors: int = 0
    """Of those, the answers with a 5xx status (hrsp_5xx)."""


def haproxy_servers(stat: str, backend: str) -> dict[str, BackendServer]:
    """The servers of `backend` in ``show stat``'s CSV (empty where it is no such reply)."""
    lines = stat.splitlines()
    if not lines or not lines[0].startswith("# "):
        return {}
    header = lines[0][2:].split(",")
    servers = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(",")))
        name = row.get("svname", "")
        if row.get("pxname") != backend or name in ("FRONTEND", "BACKEND", ""):
            continue
        servers[name] = BackendServer(
            name,
            row.get("status", ""),
            _number(row.get("scur", "")) or 0,
            _number(row.get("stot", "")) or 0,
            _number(row.get("hrsp_5xx", "")) or 0,
        )
    return servers


# ---------------------------------------------------------------- answers and records


@dataclass(frozen=True)
class Answer:
    """What one question's command printed, and its exit status (None: it never ran)."""

    out: tuple[str, ...] = ()
    err: tuple[str, ...] = ()
    rc: int | None = None


@dataclass(frozen=True)
class ContainerState:
    """A container as the runtime describes it. `found` False: there is none of that name
    (or, with `error`, the runtime could not say)."""

    found: bool
    running: bool = False
    status: str = ""
    """The runtime's state word (running, exited, created, ...); "missing" when not found."""
    exit_code: int | None = None
    started_at: str = ""
    restarts: int | None = None
    spec_hash: str = ""
    """The value of the label the question named ("" when the container carries none)."""
    image: str = ""
    """The image it was made from, as named when it was made."""
    error: str = ""
    """The runtime's error when it failed for another reason than the container's absence."""

    @property
    def phase(self) -> str:
        """running, starting (created, not started yet), missing, or the state it stopped in."""
        if not self.found:
            return "missing"
        if self.running:
            return "running"
        return "starting" if self.status in STARTING_STATES else self.status or "stopped"


@dataclass(frozen=True)
class ExecState:
    """An exec'd process: running (with its start in Unix seconds), starting (no pid file
    yet) or exited (its pid or its container is gone)."""

    state: str
    started: int | None = None


@dataclass(frozen=True)
class GateAnswer:
    """What a health gate answered: an HTTP status or a command's exit status (`code`), or
    no answer and why; `untrusted`: the server answered with a certificate the policy does not
    trust (it will not pass by waiting)."""

    code: int | None
    reason: str = ""
    untrusted: bool = False

    @property
    def text(self) -> str:
        """The answer in words: `200`, `1`, `no answer (<reason>)` or `certificate not trusted
        (<reason>)`."""
        if self.code is not None:
            return str(self.code)
        if self.untrusted:
            return f"certificate not trusted ({self.reason})"
        return f"no answer ({self.reason})" if self.reason else "no answer"

    def passes(self, expected: int) -> bool:
        return self.code == expected


@dataclass(frozen=True)
class LogTail:
    """A log's lines (stdout and stderr interleaved) and the reader's exit status."""

    lines: tuple[str, ...]
    rc: int | None


@dataclass(frozen=True)
class FileDigest:
    """A regular file's sha256 and mode (four octal digits)."""

    sha256: str
    mode: str


@dataclass(frozen=True)
class Clock:
    """The host's clock in Unix seconds (None: unreadable)."""

    now: int | None


@dataclass(frozen=True)
class ToolOutput:
    """A tool's output; `present` False where the host lacks the tool."""

    present: bool
    text: str = ""


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory, as nvidia-smi reports it (MiB)."""

    index: int
    used_mib: int
    total_mib: int


@dataclass(frozen=True)
class GpuMemories:
    """Every GPU's memory; `present` False where the host has no nvidia-smi."""

    present: bool
    gpus: tuple[GpuMemory, ...] = ()


# ---------------------------------------------------------------- the questions

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
q = shlex.quote


class Question(Generic[R_co]):
    """A command and the reader of its answer. Subclasses are frozen dataclasses."""

    kind: ClassVar[str] = ""

    def command(self) -> str:
        raise NotImplementedError

    def read(self, answer: Answer) -> R_co:
        raise NotImplementedError


def _number(word: str) -> int | None:
    return int(word) if word.lstrip("-").isdigit() else None


@dataclass(frozen=True)
class ContainerQuestion(Question[ContainerState]):
    """A container's state, exit code, start, restarts and spec label (`docker container
    inspect`)."""

    container: str
    label: str
    kind: ClassVar[str] = "container"

    def command(self) -> str:
        return f"docker container inspect {q(self.container)}"

    def read(self, answer: Answer) -> ContainerState:
        if answer.rc != 0:
            text = " ".join(line.strip() for line in answer.err if line.strip())
            absent = not text or "no such container" in text.lower()
            absent = absent or "no such object" in text.lower()
            return ContainerState(found=False, error="" if absent else text[:200])
        try:
            info = json.loads("\n".join(answer.out))[0]
        except (ValueError, IndexError, KeyError):
            return ContainerState(found=False, error="unreadable answer of docker inspect")
        state = info.get("State") or {}
        labels = (info.get("Config") or {}).get("Labels") or {}
        restarts = info.get("RestartCount")
        code = state.get("ExitCode")
        return ContainerState(
            found=True,
            running=bool(state.get("Running")),
            status=str(state.get("Status") or ""),
            exit_code=code if isinstance(code, int) else None,
            started_at=str(state.get("StartedAt") or ""),
            restarts=restarts if isinstance(restarts, int) else None,
            spec_hash=str(labels.get(self.label) or ""),
            image=str((info.get("Config") or {}).get("Image") or ""),
        )


@dataclass(frozen=True)
class ExecQuestion(Question[ExecState]):
    """Whether an exec'd process lives: its pid file inside its container, and the pid."""

    container: str
    pid_file: str
    kind: ClassVar[str] = "exec"

    def command(self) -> str:
        check = (
            f"pid=$(cat {q(self.pid_file)} 2>/dev/null) || {{ echo starting; exit 0; }}; "
            f'if kill -0 "$pid" 2>/dev/null; then echo running $(stat -c %Y {q(self.pid_file)}); '
            "else echo exited; fi"
        )
        return f"docker exec {q(self.container)} sh -c {q(check)} 2>/dev/null || echo exited"

    def read(self, answer: Answer) -> ExecState:
        words = " ".join(answer.out).split()
        state = words[0] if words and words[0] in {"running", "starting"} else "exited"
        started = _number(words[1]) if state == "running" and len(words) > 1 else None
        return ExecState(state, started)


@dataclass(frozen=True)
class HttpQuestion(Question[GateAnswer]):
    """The HTTP status a URL answers on the host (a GET), under :data:`HTTP_PROBE`'s
    certificate policy; `ca_file`: the CA to trust besides the system's, where it exists."""

    url: str
    ca_file: str = ""
    python: str = "python3"
    timeout_s: float = ANSWER_TIMEOUT_S
    kind: ClassVar[str] = "http"

    def command(self) -> str:
        return (
            f"{q(self.python)} -c {q(HTTP_PROBE)} {q(self.url)} {self.timeout_s:g} "
            f"{q(self.ca_file)}"
        )

    def read(self, answer: Answer) -> GateAnswer:
        text = " ".join(answer.out).strip()
        if text.isdigit():
            return GateAnswer(int(text))
        if answer.rc is None:
            return GateAnswer(None, "not asked")
        if text.startswith("untrusted"):
            return GateAnswer(None, text.removeprefix("untrusted").strip(), untrusted=True)
        reason = text.removeprefix("no answer").strip()
        if not text:
            reason = " ".join(answer.err).strip()[:200] or f"the probe exited {answer.rc}"
        return GateAnswer(None, reason)


@dataclass(frozen=True)
class CommandQuestion(Question[GateAnswer]):
    """The exit status of a command run in a container; with `timeout_s`, 124 past it (None:
    the command bounds itself, as a gate's command does)."""

    container: str
    argv: tuple[str, ...]
    timeout_s: float | None = None
    kind: ClassVar[str] = "command"

    def command(self) -> str:
        argv = " ".join(q(a) for a in self.argv)
        bound = f"timeout {self.timeout_s:g} " if self.timeout_s is not None else ""
        return f"{bound}docker exec {q(self.container)} {argv}"

    def read(self, answer: Answer) -> GateAnswer:
        return GateAnswer(answer.rc, "" if answer.rc is not None else "not asked")


@dataclass(frozen=True)
class LogQuestion(Question[LogTail]):
    """A process's log: its container's (`docker logs`), or, for an exec'd process, the file
    its output goes to inside the container (`log_file`; no timestamps: `since` does not apply
    to it)."""

    container: str
    log_file: str = ""
    tail: int | None = None
    since: str | None = None
    kind: ClassVar[str] = "log"

    def command(self) -> str:
        return f"{self.stream_command(follow=False)} 2>&1"

    def stream_command(self, follow: bool) -> str:
        """The reader; following, it ends the container-side `tail` when the caller goes away
        (its stdin closes)."""
        container = q(self.container)
        if self.log_file:
            count = f"-n {self.tail}" if self.tail is not None else "-n +1"
            path = q(self.log_file)
            if follow:
                inner = f"tail {count} -F {path} & t=$!; cat >/dev/null; kill $t"
                return f"docker exec -i {container} sh -c {q(inner)}"
            return f"docker exec {container} tail {count} {path}"
        words = ["docker", "logs"]
        if follow:
            words.append("--follow")
        if self.tail is not None:
            words += ["--tail", str(self.tail)]
        if self.since:
            words += ["--since", q(self.since)]
        return " ".join([*words, container])

    @property
    def source(self) -> str:
        """Where the log is read from, in words."""
        if self.log_file:
            return f"{self.log_file} in container {self.container}"
        return f"docker logs {self.container}"

    def read(self, answer: Answer) -> LogTail:
        return LogTail(answer.out, answer.rc)


@dataclass(frozen=True)
class FileQuestion(Question[Optional[FileDigest]]):
    """A regular file's sha256 and mode (None: no regular file there)."""

    path: str
    kind: ClassVar[str] = "file"

    def command(self) -> str:
        p = q(self.path)
        return f"[ -f {p} ] || exit 1; sha256sum < {p} && stat -L -c %a {p}"

    def read(self, answer: Answer) -> FileDigest | None:
        if answer.rc != 0 or len(answer.out) < 2:
            return None
        return FileDigest(answer.out[0].split()[0], answer.out[1].strip().zfill(4))


@dataclass(frozen=True)
class ClockQuestion(Question[Clock]):
    """The host's clock."""

    kind: ClassVar[str] = "clock"

    def command(self) -> str:
        return "date +%s"

    def read(self, answer: Answer) -> Clock:
        return Clock(_number(answer.out[0].strip()) if answer.out else None)


@dataclass(frozen=True)
class ToolQuestion(Question[ToolOutput]):
    """What `argv` prints (its errors dropped), where the host has `argv[0]`."""

    argv: tuple[str, ...]
    kind: ClassVar[str] = "tool"

    def command(self) -> str:
        return f"command -v {q(self.argv[0])} >/dev/null 2>&1 || exit 127; {shlex.join(self.argv)}"

    def read(self, answer: Answer) -> ToolOutput:
        if answer.rc in (None, 127) and not answer.out:
            return ToolOutput(False)
        return ToolOutput(True, "\n".join(answer.out))


def _printed(answer: Answer) -> ToolOutput:
    """What a probe script printed (it prints its own `no answer <why>`); absent where it
    never ran."""
    if answer.rc is None:
        return ToolOutput(False)
    return ToolOutput(True, "\n".join(answer.out))


@dataclass(frozen=True)
class HttpBodyQuestion(Question[ToolOutput]):
    """What a plain http URL answers on the host (a GET; :data:`HTTP_BODY_PROBE`): its body,
    or `no answer <why>`; `key_file`: the bearer key to send, where that file exists."""

    url: str
    key_file: str = ""
    python: str = "python3"
    timeout_s: float = ANSWER_TIMEOUT_S
    kind: ClassVar[str] = "http_body"

    def command(self) -> str:
        return (
            f"{q(self.python)} -c {q(HTTP_BODY_PROBE)} {q(self.url)} {self.timeout_s:g} "
            f"{q(self.key_file)}"
        )

    def read(self, answer: Answer) -> ToolOutput:
        return _printed(answer)


@dataclass(frozen=True)
class HaproxyQuestion(Question[ToolOutput]):
    """HAProxy's reply to `request` on its runtime API at `socket` (:data:`HAPROXY_PROBE`), or
    `no answer <why>`."""

    socket: str
    request: str = "show stat"
    python: str = "python3"
    timeout_s: float = ANSWER_TIMEOUT_S
    kind: ClassVar[str] = "haproxy"

    def command(self) -> str:
        return (
            f"{q(self.python)} -c {q(HAPROXY_PROBE)} {q(self.socket)} {q(self.request)} "
            f"{self.timeout_s:g}"
        )

    def read(self, answer: Answer) -> ToolOutput:
        return _printed(answer)


@dataclass(frozen=True)
class GpuMemoryQuestion(Question[GpuMemories]):
    """Each GPU's memory in use and in all (nvidia-smi), where the host has nvidia-smi."""

    kind: ClassVar[str] = "gpu_memory"

    def command(self) -> str:
        return (
            "command -v nvidia-smi >/dev/null 2>&1 || exit 127; "
            "nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits"
        )

    def read(self, answer: Answer) -> GpuMemories:
        if answer.rc in (None, 127):
            return GpuMemories(False)
        gpus = []
        for line in answer.out:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3 and all(p.isdigit() for p in parts):
                gpus.append(GpuMemory(int(parts[0]), int(parts[1]), int(parts[2])))
        return GpuMemories(True, tuple(gpus))


QUESTIONS: dict[str, type[Question[Any]]] = {
    cls.kind: cls
    for cls in (
        ContainerQuestion,
        ExecQuestion,
        HttpQuestion,
        CommandQuestion,
        LogQuestion,
        FileQuestion,
        ClockQuestion,
        ToolQuestion,
        HttpBodyQuestion,
        HaproxyQuestion,
        GpuMemoryQuestion,
    )
}
"""Every question, by kind: the registry."""


def question_json(question: Question[Any]) -> dict[str, Any]:
    """A question as JSON (for a module's arguments): its kind and fields."""
    return {"kind": question.kind, **dataclasses.asdict(question)}  # type: ignore[call-overload]


def question_from_json(data: dict[str, Any]) -> Question[Any]:
    """The question :func:`question_json` wrote."""
    fields = dict(data)
    cls = QUESTIONS[str(fields.pop("kind"))]
    if "argv" in fields:
        fields["argv"] = tuple(fields["argv"])
    return cls(**fields)


def record_json(record: Any) -> Any:
    """A record as JSON (None stays None)."""
    return None if record is None else dataclasses.asdict(record)


RecordT = TypeVar("RecordT")


def record_from_json(cls: type[RecordT], data: Any) -> RecordT | None:
    """The record :func:`record_json` wrote (None where `data` is not one)."""
    if not isinstance(data, dict):
        return None
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names})


# ---------------------------------------------------------------- a batch: one round trip


@dataclass(frozen=True)
class Ticket(Generic[R_co]):
    """A question in a batch, under its key: what reads its answer back."""

    key: str
    question: Question[R_co]


class Answers:
    """A batch's answer, read: each question's record by its ticket."""

    def __init__(self, answers: dict[str, Answer], complete: bool) -> None:
        self.raw = answers
        self.complete = complete
        """Whether the answer ran to its end marker (False: cut short)."""

    def __getitem__(self, ticket: Ticket[R]) -> R:
        return ticket.question.read(self.raw.get(ticket.key, Answer()))


class Batch:
    """Questions asked in one script (one SSH round trip), each under a unique key."""

    def __init__(self) -> None:
        self._tickets: list[Ticket[Any]] = []

    def add(self, key: str, question: Question[R]) -> Ticket[R]:
        if "\n" in key or any(t.key == key for t in self._tickets):
            raise ValueError(f"question key {key!r}: expected a unique one-line key")
        ticket = Ticket(key, question)
        self._tickets.append(ticket)
        return ticket

    @property
    def tickets(self) -> tuple[Ticket[Any], ...]:
        return tuple(self._tickets)

    def script(self) -> str:
        """The shell script asking every question, each answer in its marked section."""
        prefix = "awk '{print \"|\" $0}'"
        lines = [
            'k2_o=$(mktemp) && k2_e=$(mktemp) || exit 1; trap \'rm -f "$k2_o" "$k2_e"\' EXIT',
        ]
        for ticket in self._tickets:
            lines.append(
                f"echo {q(f'{MARK} q {ticket.key}')}; "
                f'( {ticket.question.command()}\n) >"$k2_o" 2>"$k2_e" </dev/null; k2_rc=$?; '
                f'{prefix} "$k2_o"; echo \'{MARK} err\'; {prefix} "$k2_e"; '
                f'echo "{MARK} rc $k2_rc"'
            )
        lines.append(f"echo '{MARK} end'")
        return "\n".join(lines) + "\n"

    def read(self, output: str) -> Answers:
        """The script's output, read into each question's answer."""
        return Answers(*read_answers(output))


def read_answers(output: str) -> tuple[dict[str, Answer], bool]:
    """A batch script's output -> ({key: answer}, whether it ran to its end)."""
    found: dict[str, Answer] = {}
    key: str | None = None
    out: list[str] = []
    err: list[str] = []
    into = out
    complete = False
    for line in output.splitlines():
        if line.startswith("|"):
            if key is not None:
                into.append(line[1:])
            continue
        if line.startswith(f"{MARK} q "):
            key, out, err = line[len(MARK) + 3 :], [], []
            into = out
            found[key] = Answer(rc=None)
        elif line == f"{MARK} err":
            into = err
        elif line.startswith(f"{MARK} rc ") and key is not None:
            found[key] = Answer(tuple(out), tuple(err), _number(line[len(MARK) + 4 :].strip()))
            key = None
        elif line == f"{MARK} end":
            complete = True
    if key is not None:  # cut short inside a section
        found[key] = Answer(tuple(out), tuple(err), None)
    return found, complete


def render_answer(key: str, answer: Answer) -> str:
    """One question's answer as a batch script prints it (for a reader's tests and fixtures)."""
    lines = [f"{MARK} q {key}", *(f"|{line}" for line in answer.out), f"{MARK} err"]
    lines += [*(f"|{line}" for line in answer.err), f"{MARK} rc {answer.rc}"]
    return "\n".join(lines) + "\n"


END = f"{MARK} end\n"
"""The last line of a batch's answer."""


def ask_json(questions: dict[str, Any], python: str) -> dict[str, Any]:
    """Questions as :func:`question_json` wrote them, by key, asked here in one batch; each
    key's record as JSON (what a module on the host answers). An https question is asked with
    `python` (the module's own interpreter)."""
    batch = Batch()
    tickets = []
    for key, data in sorted(questions.items()):
        question = question_from_json(dict(data))
        if isinstance(question, HttpQuestion):
            question = dataclasses.replace(question, python=python)
        tickets.append(batch.add(key, question))
    answers = ask_here(batch)
    return {t.key: record_json(answers[t]) for t in tickets}


def ask_here(batch: Batch, timeout_s: float | None = None) -> Answers:
    """Ask a batch on this machine (the look module, on the host)."""
    try:
        done = subprocess.run(
            ["sh", "-c", batch.script()],
            capture_output=True, text=True, errors="replace", check=False, timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return batch.read("")
    return batch.read(done.stdout)
