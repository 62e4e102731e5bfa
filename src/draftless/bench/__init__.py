"""`draftless bench`: speedups of draftless and the prompt-lookup peers on a task suite.

tasks.py   the task folders under bench/tasks/ (prompts, files, references)
runner.py  the measurement: alternating reps, medians, identical-to-plain checks
peers.py   transformers and llama-cpp-python prompt-lookup decoding on the same model
report.py  results.json, results.md, speedups.png; the targets, met or missed
cli.py     the subcommand
"""
