"""The Lightning pipeline: phases as LightningModules, the DoF callbacks and the ``lit-dof`` CLI."""
