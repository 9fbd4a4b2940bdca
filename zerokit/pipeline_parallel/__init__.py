"""Pipeline parallelism: schedules as data, played out on paper and drawn.

Lifecycle: build a :class:`Schedule` by name (:func:`schedule`) or with a builder
(:func:`gpipe`, :func:`one_f_one_b`, :func:`interleaved_1f1b`, :func:`zb_h1`), hold it to
the rules with :func:`check`, time it with :func:`simulate` and draw the result (or a
measured run's spans) with :func:`draw_schedule`.
"""
from .actions import Action, Schedule
from .figures import draw_schedule, draw_side_by_side
from .schedules import gpipe, interleaved_1f1b, one_f_one_b, schedule, zb_h1
from .simulate import SimulationResult, check, measured, simulate

__all__ = ["Action", "Schedule", "schedule", "gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1",
           "simulate", "SimulationResult", "check", "measured", "draw_schedule", "draw_side_by_side"]
