"""verl plugin entry point (`verl.plugins` group): imported by every `import verl`.

Registers RPG's policy losses and advantage estimators with verl's registries in every
process (driver, TaskRunner and Ray workers). Kept import-light and failure-tolerant by
design of verl's loader (errors are logged at DEBUG by verl), so each registration module
is imported explicitly here.
"""
import rpg.verl.register  # noqa: F401,E402  (issue 4: RPG policy losses + advantage estimators)
