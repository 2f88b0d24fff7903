"""The worker: claims jobs, runs their handlers, settles the outcomes, keeps leases.

Owns the per-process orchestrator (worker.py), a queue's runner and its parts
(fetching, executing, settling, renewing), turning a claimed job into an outcome
(execute.py), the handler's ``ctx`` (context.py) and a durable function's replay of its
step log (journal.py) and child calls' ends (durable.py), the scheduler (scheduler.py), the
ticker that fires the schedules' ticks (ticker.py) and its standby for the schedules a
newer deploy holds (standby.py), retry delays (backoff.py), the guard that ends a worker
whose thread died (lifeline.py), the memory a child shares with its worker for the log
lines it holds back (spill.py) and the crash tests' fault points (faults.py).

May import: runner.config, runner.errors, runner.runtime, the store, the catalog,
observe and itself. Knows nothing of the web app, the CLI or dev.
"""
