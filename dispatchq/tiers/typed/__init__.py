"""The typed tier: fixed-set judgements answered by TypeSafe's Jev, acted on only inside the band.

Import from the modules; this package re-exports nothing, so asking about a batch never
loads the SDK:

- `batching`: pure. Asks, batches, the four outcomes, splitting and merging.
- `protocol`: pure. The `Provider` the tier talks to, its options, the keyless one.
- `provider`: the real provider over `typesafe_sdk` (the one module that imports it).
- `tier`: the worker's side (`process_batch`), the band, retries; `provider_ask` for triage.
"""

__all__: list[str] = []
