"""Verdicts shared by every doctor command: a short table, JSON, and an exit code."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from eaglewire.infra.output import emit

UNDECIDED = 3  # the exit code of a report that asks instead of deciding


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    level: str = "error"  # error | warning | question | info (errors fail the command, questions leave it undecided)


@dataclass
class Report:
    command: str
    checks: list[Check] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    question: str = ""  # what an undecided report asks the user (its verdict line)

    def add(self, name: str, ok: bool, detail: str, fix: str = "", level: str = "error") -> Check:
        c = Check(name, ok, detail, fix, level if not ok else "info")
        self.checks.append(c)
        return c

    @property
    def failed(self) -> bool:
        return any(not c.ok and c.level == "error" for c in self.checks)

    @property
    def undecided(self) -> bool:
        """No error, but a verdict hangs on something only the user knows: neither OK nor a failure."""
        return not self.failed and any(not c.ok and c.level == "question" for c in self.checks)

    @property
    def verdict(self) -> str:
        return "problems" if self.failed else "unknown" if self.undecided else "ok"

    def to_dict(self) -> dict:
        return {"command": self.command, "ok": self.verdict == "ok", "verdict": self.verdict,
                "checks": [asdict(c) for c in self.checks], **self.data}

    def print(self, as_json: bool) -> None:
        emit(self.to_dict(), as_json, lambda _: self._print_table())

    def _print_table(self) -> None:
        print(f"eaglewire doctor {self.command}")
        w = max([len(c.name) for c in self.checks] + [5])
        for c in self.checks:
            mark = "PASS" if c.ok else {"warning": "WARN", "question": "ASK"}.get(c.level, "FAIL")
            print(f"  {mark:<4}  {c.name:<{w}}  {c.detail}")
            if c.fix and not c.ok:
                print(f"        {'':<{w}}  fix: {c.fix}")
        if self.undecided:
            print(f"verdict: UNKNOWN (exit {UNDECIDED}): {self.question or 'answer the ASK rows'}")
        else:
            print(f"verdict: {'problems found' if self.failed else 'OK'}")

    def exit_code(self) -> int:
        """0 OK, 1 problems found, 3 undecided (2 is a refused input: `error: ...`)."""
        return 1 if self.failed else UNDECIDED if self.undecided else 0
