"""Config as data (``zerokit.config``): each part refused at construction with the argument named, and the keyword
calls of ``make_job`` and ``train`` meaning the same as the dataclasses."""
import pytest

import zerokit
from zerokit.config import JobConfig, MemorySavers, ParallelDims, Precision, Schedule
from zerokit.job import make_job
from zerokit.runtime.link import LINKS

WORK = zerokit.tiny_gpt(n_layer=2, d_model=32, seq_len=16, vocab=64)


@pytest.mark.parametrize("build,message", [
    (lambda: ParallelDims(0), "world_size=0 must be a positive integer"),
    (lambda: ParallelDims(4, dp=3), "the degrees must multiply to the number of ranks"),
    (lambda: ParallelDims(4, tp=3), "cp × tp × pp = 3 does not divide the world size 4"),
    (lambda: ParallelDims(2, pp=0), "pp=0 must be a positive integer"),
    (lambda: ParallelDims(4, dp=4, ep=3), "ep=3 must divide dp=4"),
    (lambda: ParallelDims(2, sequence_parallel="yes"), "sequence_parallel='yes' must be True or False"),
    (lambda: ParallelDims.of(2, {"xp": 2}), "unknown axis 'xp'"),
    (lambda: ParallelDims.of(2, [2]), "must be a dict of axis degrees"),
    (lambda: Precision("fp16"), "precision='fp16' is not supported; allowed: fp32"),
    (lambda: Schedule(steps=0), "steps=0 must be a positive integer"),
    (lambda: Schedule(micro_batches=1.5), "micro_batches=1.5 must be a positive integer"),
    (lambda: Schedule(optimizer="lion"), "optimizer='lion' is not supported; allowed"),
    (lambda: Schedule(lr=-1.0), "lr=-1.0 must be a positive number"),
    (lambda: MemorySavers("often"), "checkpointing='often' is not a checkpointing policy; known"),
    (lambda: MemorySavers("every_k"), "checkpointing='every_k' needs checkpoint_every=K"),
    (lambda: MemorySavers("every", 2), "checkpoint_every=2 applies to checkpointing='every_k' only"),
    (lambda: JobConfig(WORK, "zero9"), "strategy='zero9' is unknown; allowed"),
    (lambda: JobConfig(WORK, link="carrier pigeon"), "link='carrier pigeon'; allowed"),
    (lambda: JobConfig(WORK, options={"checkpointing": "often"}), "checkpointing='often' is not a checkpointing"),
])
def test_each_part_refused_at_construction_naming_the_argument(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("×", ".")):
        build()


def test_the_wrong_kinds_are_refused():
    with pytest.raises(TypeError, match="workload must be a zerokit.Workload, got str"):
        JobConfig("gpt")
    with pytest.raises(TypeError, match=r"JobConfig\(parallel=…\) needs a zerokit.config.ParallelDims, got dict"):
        JobConfig(WORK, parallel={"dp": 2})
    with pytest.raises(TypeError, match=r"JobConfig\(precision=…\) needs a zerokit.config.Precision, got str"):
        JobConfig(WORK, precision="fp32")


def test_parallel_dims_read_back_as_the_keyword():
    assert ParallelDims(2).parallel is None
    assert ParallelDims.of(4, {"dp": 2, "tp": 2}) == ParallelDims(4, dp=2, tp=2)
    assert ParallelDims(4, dp=2, tp=2).parallel == {"dp": 2, "tp": 2}


def test_keywords_carried_in_options_move_to_their_parts():
    config = JobConfig(WORK, parallel=ParallelDims(2, cp=2), options={
        "checkpointing": "every_k", "checkpoint_every": 1, "link": "nvlink", "cp_attention": "ulysses",
        "bucket_mb": 1.0})
    assert config.memory == MemorySavers("every_k", 1)
    assert config.parallel.cp_attention == "ulysses"
    assert config.link is LINKS["nvlink"]
    assert config.options == {"bucket_mb": 1.0}


KEYWORD_CALLS = [
    ((WORK, "ddp", 2, 3, "fp32", "sgd", 0.1, 2, {}), {},
     JobConfig(WORK, "ddp", ParallelDims(2), Precision(), Schedule(3, 2, "sgd", 0.1))),
    ((WORK, "zero2", 4, 2, "bf16-mixed", "adamw", 1e-3, 1, {"checkpointing": "every", "link": "pcie"}),
     dict(parallel={"dp": 2, "tp": 2}, sequence_parallel=True, track_peak=False),
     JobConfig(WORK, "zero2", ParallelDims(4, dp=2, tp=2, sequence_parallel=True), Precision("bf16-mixed"),
               Schedule(2, 1, "adamw", 1e-3), MemorySavers("every"), track_peak=False, link="pcie")),
    ((WORK, "pp", 2, 2, "fp32", "sgd", 0.1, 4, {"schedule": "gpipe"}), dict(keep_records=True),
     JobConfig(WORK, "pp", ParallelDims(2), schedule=Schedule(2, 4, "sgd", 0.1), options={"schedule": "gpipe"},
               keep_records=True)),
    ((WORK, "ddp", 4, 2, "fp32", "adamw", 1e-3, 1, {"cp_attention": "ulysses"}), dict(parallel={"dp": 2, "cp": 2}),
     JobConfig(WORK, "ddp", ParallelDims(4, dp=2, cp=2, cp_attention="ulysses"), schedule=Schedule(2))),
]


@pytest.mark.parametrize("args,kwargs,config", KEYWORD_CALLS)
def test_the_keyword_call_and_the_dataclasses_make_the_same_job(args, kwargs, config):
    assert JobConfig.from_keywords(*args, **kwargs) == config
    assert make_job(*args, **kwargs) == make_job(config)


def test_make_job_takes_a_config_or_keywords_not_both():
    with pytest.raises(TypeError, match="the JobConfig holds every setting; strategy given too"):
        make_job(JobConfig(WORK), "ddp")
    with pytest.raises(TypeError, match="needs a JobConfig, or the keywords strategy"):
        make_job(WORK)


def test_train_takes_a_config_or_keywords_not_both():
    with pytest.raises(TypeError, match="steps, bucket_mb given too"):
        zerokit.train(JobConfig(WORK), steps=3, bucket_mb=1.0)


def test_train_with_a_config_runs_as_the_keyword_call():
    by_keywords = zerokit.train(WORK, "zero1", 2, 2, optimizer="sgd", lr=0.1, checkpointing="every", reference=False)
    by_config = zerokit.train(JobConfig(WORK, "zero1", ParallelDims(2), schedule=Schedule(2, optimizer="sgd", lr=0.1),
                                        memory=MemorySavers("every")), reference=False)
    keyword_ranks, config_ranks = by_keywords.results[0].ranks, by_config.results[0].ranks
    assert [r.losses for r in keyword_ranks] == [r.losses for r in config_ranks]
    assert [r.recomputed_forwards for r in config_ranks] == [r.recomputed_forwards for r in keyword_ranks] != [0, 0]
