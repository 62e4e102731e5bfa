"""`draftless serve`: an OpenAI-compatible HTTP server, a thin layer over the library.

    protocol.py  the wire format: pydantic request models, response bodies, error bodies
    engine.py    one worker thread owns the model; requests queue in front of it
    history.py   the cross-request draft index, bounded in bytes
    metrics.py   Prometheus metrics
    app.py       the FastAPI routes (parse, queue, answer or stream)

FastAPI, uvicorn, sse-starlette and prometheus_client are imported only here; the subcommand
is `cli/serve.py`
(`pip install 'draftless[serve]'`).
"""
