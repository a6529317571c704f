"""scenarios.py -- the scenarios and level shape of `kvrouter bench study` (bench/vcluster/study.c:
kvr_study_scenarios), for the scripts that run them in real time against `kvrouter sim` workers
(replicas/replicas_ab.py, precise/precise_realtime.py), so a real run is comparable with the
virtual study's. Shared (bench/scripts/lib/): no experiment of its own; writes nothing.

The mixed fleet's --worker-blocks is virtual only: a real run gives its last sim --num-gpu-blocks
HALF_BLOCKS instead.
"""

# bench flags of each scenario; they go after LEVEL, whose flags they may override (agentic's
# --num-prompts, as study.c explains)
SCENARIOS = {
    "multiturn": ["--workload", "multiturn", "--multiturn-mode", "session", "--warmup-s", "120"],
    "documents": ["--workload", "documents", "--warmup-s", "60"],
    "control": ["--workload", "control", "--warmup-s", "60"],
    "agentic": ["--workload", "agentic", "--warmup-s", "300", "--num-prompts", "300"],
    "hot-prefix": ["--workload", "hot-prefix", "--warmup-s", "60"],
    "bursty": ["--workload", "multiturn", "--multiturn-mode", "session", "--warmup-s", "120",
               "--burstiness", "0.3"],
    "mixed-fleet": ["--workload", "documents", "--warmup-s", "60"],
}
# a level: its measured requests after the scenario's warm-up, at least 60 simulated seconds
LEVEL = ["--num-prompts", "100", "--warmup", "0", "--min-level-s", "60", "--cooldown-s", "10"]
# KV blocks of a simulated H200 worker (`kvrouter sim` default), and the mixed fleet's small one
FULL_BLOCKS, HALF_BLOCKS = 21770, 10885
