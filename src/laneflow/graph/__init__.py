"""The lazy graph: nodes (``ArrayData``) and the scheduler that turns them into commands."""
