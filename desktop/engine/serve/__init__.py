"""Nanoscope as an OpenAI-compatible server (``nanoscope serve``, the window's Server switch).

Qt-free. ``wire`` validates requests and shapes errors, ``host`` runs the one loaded model on its
own thread, ``replies`` turns token events into OpenAI choices, ``app`` maps the HTTP routes, and
``server`` runs it all under uvicorn.
"""
