"""The tests' own support, in one place: loopback fakes of the services dispatchq talks to
(GitHub, the Messages API), the fake `claude` session command (`fake_claude.py`, run by path
as a script), and the scaffolding the gate and serve tests share (`gate.py`, `serve.py`).

Test doubles that bench/ and the demo use too live in `dispatchq.testing` instead, so that
nothing outside tests/ has to import tests/.
"""
