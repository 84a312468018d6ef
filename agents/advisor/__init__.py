"""The advisor on the host: one `Advisor` per run and market (`advisor`: the only object that talks to the model:
prompt template and fields, store, host copy of the advice table, workers), driven by pacers that decide which keys
to ask and when (`pacer` for training's and walks' query steps; live trading's is agents.trading.advice); `workers`
runs the sidecars; `query_loop` plugs the advisor into a training update; `store` keeps the answers on disk and
`fill` fills it ahead of training (scripts/advise.py); `outcomes` and `later_sessions` serve advisor learning."""
