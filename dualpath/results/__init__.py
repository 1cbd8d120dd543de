"""Results pages: docs/results/<kind>.md generated from the tools' JSON reports in docs/results/data/."""
