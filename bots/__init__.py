"""Runnable bots on durable-bots: the CLI (`python -m bots`, `durable-bots`), TOML config, and the ops bot.

python -m bots run --config config/ops.toml --adapter devchat
python -m bots inspect | tasks | retry TASK | approvals | export CONVERSATION | check-config
"""
