"""rollart.app: the rollart application: a run composed from a config, the `rollart` command, the demo and the simulator.

It sits above every other rollart package and composes them; nothing imports it.

Modules:

- `rollart.app.config`: the YAML run config (pydantic) with errors naming the field and the allowed values;
  `rollart.app.overrides`: `--set dotted.key=value`.
- `rollart.app.registry`, `rollart.app.task_factory`, `rollart.app.tasks`: envs, rewards and prompts by name or import path.
- `rollart.app.builder`: one builder for `rollart run`, `rollart sim` and the tests (pools, routing, trainer, sync).
- `rollart.app.model_source`, `engines`, `actors`, `ray_workers`, `trainers`: the model, the Ray actor bodies
  and the trainer glue of a real run.
- `rollart.app.plan`: `rollart plan`; `rollart.app.cli`: the `rollart` command; `rollart.app.demo`: `make demo`.
- `rollart.app.sim`: the cluster simulator (`rollart sim`): scenarios, simulated parts, the runner.
"""

__version__ = "0.1.0"
