"""glassgpt.serve: a trained model behind an OpenAI-compatible API, with an explorer page.

    glassgpt serve --checkpoint DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY]

- ``app.create_app``: the FastAPI app (``/v1/*``, ``/api/*``, the page at ``/``);
- ``scheduler.Scheduler``: continuous batching, one forward per step for every sequence;
- ``slots.SlotCache``: the KV cache whose rows each have their own length;
- ``explore``: the page's JSON, over ``glassgpt.inspect``.

See docs/serving.md.
"""
