"""The evaluator and go/no-go report (issue: the evaluator). Not built yet."""
