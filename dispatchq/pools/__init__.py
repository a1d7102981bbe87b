"""The credential pool: several credentials, each with its own windows, slots and spend.

`credentials` is the pool as data (what the YAML file's `credentials:` section, or the one
credential of the environment, describes); `routing` decides, purely, which credential a
judgement may use now and in what order; `spend` is the cap arithmetic. Nothing here does
I/O: the window (`dispatchq.window.face`) reads the state and takes the slot.
"""

__all__: list[str] = []
