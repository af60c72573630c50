"""Verdicts shared by every doctor command: a short table, JSON, and an exit code."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from eaglewire.infra.output import emit


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    level: str = "error"  # error | warning | info (only errors fail the command)


@dataclass
class Report:
    command: str
    checks: list[Check] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def add(self, name: str, ok: bool, detail: str, fix: str = "", level: str = "error") -> Check:
        c = Check(name, ok, detail, fix, level if not ok else "info")
        self.checks.append(c)
        return c

    @property
    def failed(self) -> bool:
        return any(not c.ok and c.level == "error" for c in self.checks)

    def to_dict(self) -> dict:
        return {"command": self.command, "ok": not self.failed, "checks": [asdict(c) for c in self.checks], **self.data}

    def print(self, as_json: bool) -> None:
        emit(self.to_dict(), as_json, lambda _: self._print_table())

    def _print_table(self) -> None:
        print(f"eaglewire doctor {self.command}")
        w = max([len(c.name) for c in self.checks] + [5])
        for c in self.checks:
            mark = "PASS" if c.ok else ("WARN" if c.level == "warning" else "FAIL")
            print(f"  {mark:<4}  {c.name:<{w}}  {c.detail}")
            if c.fix and not c.ok:
                print(f"        {'':<{w}}  fix: {c.fix}")
        print(f"verdict: {'problems found' if self.failed else 'OK'}")

    def exit_code(self) -> int:
        return 1 if self.failed else 0
