"""What both text classifier trainers share, owned by neither (they never import each other):
contracts and `components.common` only, frameworks inside functions."""
