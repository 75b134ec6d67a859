"""One adapter per trace format: the parsed data of that shape -> its canonical view (`reflector.analysis.traces.view`).

Each module's `_norm_*` function is registered by format name in `reflector.analysis.traces.load`. No adapter
sees everything, so every view keeps the raw data at hand for the model to dig further.
"""
