"""The Lightning pipeline: the training phases as LightningModules, their planners and callbacks, the memory plan
and the ``lit-dof fit|validate|test|predict|plan`` CLI.

* phases — :mod:`~lit_dof.pipeline.module` (the shared base: build, validate, export),
  :mod:`~lit_dof.pipeline.layerwise` (layer-wise distillation and its end-to-end tail),
  :mod:`~lit_dof.pipeline.direct` (the direct baseline), :mod:`~lit_dof.pipeline.capture` (``lit-dof predict``:
  teacher q/k and their DoF report); their settings in :mod:`~lit_dof.pipeline.optimization` and
  :mod:`~lit_dof.pipeline.teacher_reuse`;
* feature dims — :mod:`~lit_dof.pipeline.planner` (the planners) and :mod:`~lit_dof.pipeline.allocation`;
* before a run — :mod:`~lit_dof.pipeline.validation` (settings refused early), :mod:`~lit_dof.pipeline.architecture`
  (the teacher without its weights), :mod:`~lit_dof.pipeline.plan` and :mod:`~lit_dof.pipeline.plan_report`
  (``lit-dof plan``, the memory plan);
* scale — :mod:`~lit_dof.pipeline.strategies` (FSDP2) and :mod:`~lit_dof.pipeline.replication`;
* a run's files — :mod:`~lit_dof.pipeline.callbacks` (``dof.json``, DoF figures), :mod:`~lit_dof.pipeline.run_files`
  (``metrics.jsonl``, figures), :mod:`~lit_dof.pipeline.training_record`, :mod:`~lit_dof.pipeline.resume`,
  :mod:`~lit_dof.pipeline.run_cleanup`; :mod:`~lit_dof.pipeline.fit_config` (what the tools around a fit read of its
  config);
* the command line — :mod:`~lit_dof.pipeline.cli`, :mod:`~lit_dof.pipeline.cli_help`, :mod:`~lit_dof.pipeline.console`.
"""
