"""verl 0.9.1 glue for RPG: the registrations, loss adapters, worker, trainer and the recipe's driver with its
checks before Ray (docs/verl-integration.md). Nothing is imported here, so that ``import rpg.verl`` stays free of
verl's trainer and worker stack.
"""
