"""The benchmark harness: servers, processes, systems, scenarios and reports."""
