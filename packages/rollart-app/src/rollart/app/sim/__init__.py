"""rollart.app.sim: the cluster simulator behind `rollart sim`.

The same builder and pipeline as a real run, in virtual time, with simulated engines, trainer and
weight sync (roofline cost models from the hardware catalogue):

- `rollart.app.sim.scenario`: a scenario file (a run config, a workload, the runs to compare);
- `rollart.app.sim.parts`: the simulated envs, prompts and trainer the builder composes;
- `rollart.app.sim.runner`: runs a scenario's runs and renders their table, JSON and role picture.
"""
