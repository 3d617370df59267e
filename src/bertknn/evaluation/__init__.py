"""The LAMA probe: its data (lama_data), facts as questions (facts), metrics, result files (results), the runner
(run), reports (report) and the grid search (tune)."""
