"""The optimization strategies ``ir.compile(strategy=...)`` names (shown as ``pypto.ir.pass_manager``).

PyPTO lowers a program through a pipeline of IR passes chosen by ``OptimizationStrategy``.
ptodist has no IR to lower: a program's Python functions run as written, and what "compiling"
means here is the same short sequence of stages for every strategy (listed by
``PassManager.get_strategy(...).pass_names``).  The strategy is accepted and recorded.
"""

from __future__ import annotations

import enum

from ..errors import ApiTypeError, UsageError


class OptimizationStrategy(enum.Enum):
    """PyPTO's pass pipelines (recorded only: ptodist's compile stages are the same for each)."""

    Default = "Default"
    DebugTileOptimization = "DebugTileOptimization"


# What ptodist does with a program, in order: (name, what it does, when).
STAGES = (
    ("CheckProgramSignatures", "parameter annotations and the calls between functions are checked", "compile"),
    ("BindArguments", "host tensors are bound to the parameters; shapes and dtypes checked", "each call"),
    ("PlanDispatch", "the host orchestrator runs once to record each rank's tasks and windows", "first call per "
                     "argument signature"),
    ("WriteDispatchPlan", "the plan is written to output_dir/dispatch_plan.json", "with each new plan"),
    ("RunRanks", "the backend runs every rank's tasks (numpy on the CPU)", "each call"),
)


class PassManager:
    """The stages ptodist runs for a strategy: ``pass_names`` lists them; there are no IR passes to run."""

    def __init__(self, strategy: OptimizationStrategy = OptimizationStrategy.Default, *,
                 analyze_auto_scopes_for_deps: bool = False):
        if not isinstance(strategy, OptimizationStrategy):
            raise ApiTypeError(f"PassManager: strategy must be an OptimizationStrategy "
                               f"({', '.join('OptimizationStrategy.' + s.name for s in OptimizationStrategy)}), "
                               f"got {strategy!r}")
        self.strategy = strategy
        self.analyze_auto_scopes_for_deps = bool(analyze_auto_scopes_for_deps)
        self.pass_names = [name for name, _, _ in STAGES]

    @classmethod
    def get_strategy(cls, strategy: OptimizationStrategy = OptimizationStrategy.Default, *,
                     analyze_auto_scopes_for_deps: bool = False) -> PassManager:
        """Return the PassManager of ``strategy`` (every strategy lists the same ptodist stages)."""
        return cls(strategy, analyze_auto_scopes_for_deps=analyze_auto_scopes_for_deps)

    def describe(self) -> str:
        """One line per stage: its name, what it does and when it runs."""
        return "\n".join(f"{name}: {what} ({when})" for name, what, when in STAGES)

    def run_passes(self, program, dump_ir: bool = False, output_dir: str | None = None, prefix: str = "pl"):
        """Refused: ptodist has no IR for passes to transform; compile with ``ir.compile(program)`` instead."""
        raise UsageError("PassManager.run_passes(): ptodist has no IR to transform: a program's functions run as "
                         "written, so there is no lowered program to return or dump. Compile and run it with "
                         "ir.compile(program) (PassManager.pass_names lists what that does).")

    def __repr__(self) -> str:
        return f"<PassManager {self.strategy.name}: {', '.join(self.pass_names)}>"

