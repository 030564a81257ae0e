"""diagnose on the outcomes its first corpus missed (issue 55): a user's interrupt, a run that finished and then
printed errors, schedulers' and shells' own words for an OOM, a kill or a time limit, one task failing before the
launcher stops the rest, a stop on a spot machine; and the confidence and competing verdict every diagnosis
carries. The lines are written from the tools' documented formats (the sourced real ones are in corpus/real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptible.cli import main
from preemptible.diagnose import CONFIDENCE, VERDICTS, diagnose


def _verdict(*lines: str, exit_code: int | None = None) -> str:
    return diagnose([("log", list(lines))], exit_code=exit_code).verdict


def test_a_user_s_interrupt_is_its_own_verdict_and_explains_the_clean_up_crash_after_it() -> None:
    crash_in_clean_up = [
        "Traceback (most recent call last):",
        '  File "train.py", line 80, in <module>',
        "    loss.backward()",
        "KeyboardInterrupt",
        "Traceback (most recent call last):",
        '  File "train.py", line 95, in <module>',
        "    writer.close()",
        "RuntimeError: the queue is closed",
    ]
    assert _verdict(*crash_in_clean_up) == "interrupted"
    assert _verdict("step 10 loss 2.0", "^CTraceback (most recent call last):", "  File 'x.py'") == "interrupted"
    assert _verdict("srun: interrupt (one more within 1 sec to abort)") == "interrupted"
    assert _verdict("step 10", exit_code=130) == "interrupted"  # 128 + SIGINT
    assert _verdict("Process finished with exit code -1073741510") == "interrupted"  # Windows: Ctrl-C
    # a SIGTERM is not an interrupt, and a crash with no interrupt is a crash
    assert _verdict("step 10", exit_code=143) == "terminated"
    assert _verdict(*crash_in_clean_up[4:]) == "crashed"


def test_a_run_that_reached_its_end_stays_completed_whatever_it_prints_while_shutting_down() -> None:
    after = ["Traceback (most recent call last):", '  File "run.py", line 9', "OSError: upload failed"]
    done = diagnose([("log", ["step 999 loss 0.1", "Training completed. Do not forget to share your model", *after])])
    assert done.verdict == "completed" and "while shutting down" in done.summary
    assert _verdict("[after training is done] datetime: 2025-09-24 16:08:38", "Segmentation fault (core dumped)") == (
        "completed"
    )
    # an epoch's end is not the run's end, and an error before the end is not shutdown noise
    assert _verdict("Epoch 3 training completed", *after) == "crashed"
    assert _verdict(*after, "Training completed. Do not forget to share your model") == "crashed"


def test_an_exception_python_went_on_from_does_not_end_the_process() -> None:
    ignored = [
        "Exception ignored in: <function _DataLoaderIter.__del__ at 0x7f>",
        "Traceback (most recent call last):",
        '  File "dataloader.py", line 717, in __del__',
        "RuntimeError: worker 3 is gone",
    ]
    # Python printed it and went on: only a hint that the interpreter was shutting down at the program's end
    assert [(e.verdict, e.strength) for e in diagnose([("log", ignored)]).evidence] == [("completed", "hint")]
    assert _verdict("Traceback (most recent call last):", '  File "t.py", line 3', "ValueError: bad", *ignored) == (
        "crashed"
    )  # a failure before it decides
    # another thread's: that thread died and the process went on (most often a teardown's thread at the run's end),
    # also when the log cuts its traceback off, and for a traceback chained to it
    thread = ["Exception in thread Thread-7:", *ignored[1:]]
    found = diagnose([("log", thread)])
    assert [(e.verdict, e.strength) for e in found.evidence] == [("completed", "hint")]
    assert (found.verdict, found.competing) == ("completed", "crashed")
    assert [(e.verdict, e.strength) for e in diagnose([("log", thread[:3])]).evidence] == [("completed", "hint")]
    chained = [*thread, "During handling of the above exception, another exception occurred:", *thread[1:3]]
    assert {e.verdict for e in diagnose([("log", chained)]).evidence} == {"completed"}
    # but a thread that ran the training itself (Python names its target): its exception ends the run
    work = ["Exception in thread Thread-4 (__training_thread_function):", *ignored[1:]]
    assert [(e.verdict, e.strength) for e in diagnose([("log", work)]).evidence] == [("crashed", "strong")]


@pytest.mark.parametrize(
    ("line", "verdict"),
    [
        ("已杀死", "oom"),  # zh_CN bash: a bare SIGKILL from the shell reads as the OOM killer's
        ("Убито", "oom"),  # ru_RU bash
        ("zsh: killed     python3 train.py --epochs 100", "oom"),
        ("**Killed**", "oom"),
        ("worker exited with error code -9", "oom"),
        ("Job exited with exit status 137", "oom"),
        ("trainer.service: Main process exited, code=killed, status=9/KILL", "oom"),
        ("trainer.service: A process of this unit has been killed by the OOM killer.", "oom"),
        ("Ошибка сегментирования", "crashed"),
        ("段错误 (核心已转储)", "crashed"),
        ("Process finished with exit code -1073741819 (0xC0000005)", "crashed"),
        ("Windows fatal exception: access violation", "crashed"),
        ("TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.", "oom"),
        ("TERM_RUNLIMIT: job killed after reaching LSF run time limit.", "time-limit"),
        ("=>> PBS: job killed: walltime 3610 exceeded limit 3600", "time-limit"),
        ("=>> PBS: job killed: mem 38427376kb exceeded limit 33554432kb", "oom"),
        ("Job in status 2 put on hold by SYSTEM_PERIODIC_HOLD due to memory usage 3000000.", "oom"),
        ("Event: ULOG_JOB_EVICTED for HTCondor Node train_1 (5437648.0.0)", "preempted"),
        ("submitit WARNING (2022-07-12 04:18:45) - Caught signal SIGUSR1 on n1: this job is preempted.", "preempted"),
        ("UncompletedJobError: Job not requeued because: timed-out and not checkpointable.", "time-limit"),
        (" train-llm-3  aws  g5.xlarge  terminated  STOPPED_BY_USER", "terminated"),
        ("$ kubectl delete pod mnist-ddp-worker-1", "terminated"),
        ("failed to allocate 512.00M from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "oom"),
        ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB", "oom"),
        ("Container killed by YARN for exceeding memory limits. 12.1 GB of 12 GB physical memory used.", "oom"),
        ("已终止", "terminated"),  # zh_CN bash: SIGTERM
        ("ray.exceptions.ActorDiedError: The actor died because its node has died. Node Id: 5e1f", "preempted"),
        ("I 09-12 22:49:49 controller.py:545] Cluster is preempted or failed. Recovering...", "preempted"),
    ],
)  # fmt: skip
def test_the_same_facts_in_other_tools_words_and_other_languages(line: str, verdict: str) -> None:
    assert _verdict(line) == verdict, diagnose([("log", [line])]).render()


@pytest.mark.parametrize(
    ("line", "verdict"),
    [
        # a signal or an exit in anyone's words: the process's own handler, a supervisor, a tool
        ("INFO: Received SIGTERM, shutting down gracefully", "terminated"),
        ("Caught signal 15, saving and exiting", "terminated"),
        ("signal 15 received, exiting", "terminated"),
        ("worker 3 terminated by signal 15", "terminated"),
        ("child process died of SIGKILL", "oom"),
        ("rank 2 exited with signal 9", "oom"),
        ("ERROR: process 4121 exited with code -15", "terminated"),
        ("Received SIGINT, stopping", "interrupted"),
        ("zsh: warning: 1 jobs SIGHUPed", "terminated"),
        ("2017/03/16 13:50:06 bds: Received OS signal 'hangup'", "terminated"),
        ("nohup.sh: line 4: 81061 Hangup                  python train.py", "terminated"),
        ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 81061 got sigval:1", "terminated"),
        ("KeyboardInterrupt: ", "interrupted"),
        ("KeyboardInterrupt                         Traceback (most recent call last)", "interrupted"),
        # faults in the shell's, glibc's and a signal handler's words
        ("./run.sh: line 3: 4242 Aborted                 (core dumped) python train.py", "crashed"),
        ("Floating point exception (core dumped)", "crashed"),
        ("free(): invalid next size (normal)", "crashed"),
        ("double free or corruption (!prev)", "crashed"),
        ("[node-0:391803] Signal: Aborted (6)", "crashed"),
        ('exec: "train": executable file not found in $PATH', "crashed"),
        # memory, time, evictions and preemptions in plain words
        ("[123456.789] Killed process 4242 (python) total-vm:83886080kB, anon-rss:80000000kB", "oom"),
        ("the worker was killed by the out-of-memory killer", "oom"),
        ("the process ran out of memory while loading the dataset", "oom"),
        ("Job 4242 exceeded its time limit and was cancelled", "time-limit"),
        ("modal.exception.FunctionTimeoutError: Task's current input in-abc hit its timeout of 300s", "time-limit"),
        ("failed       37  : qmaster enforced h_rt, h_cpu, or h_vmem limit", "time-limit"),
        ("Warning: pod was evicted due to node pressure", "terminated"),
        ("task 7 was preempted by a higher-priority job", "preempted"),
        ("Spot instance i-0abc was reclaimed", "preempted"),
        ("worker-3: received preemption notice, saving", "preempted"),
        ("Got a spot interruption warning", "preempted"),
        ("pod trainer-0 deleted by priority preemption", "preempted"),
        ("JOB 123 CANCELLED AT 2024-01-01T00:00:00 DUE TO PREEMPTION", "preempted"),  # (without slurmstepd's stars)
        ("Shutting down due to SIGTERM", "terminated"),
        ("Signal 1 received, Abort", "terminated"),  # a program's own handler, capitalised
        ("sighup received", "terminated"),
        ("Exiting due to signal 15", "terminated"),
        ("### Job 220900805.cbqs01 - Exit status is 0", "completed"),  # a PBS epilogue's words
        ("Exit status is 1", "crashed"),
        ("SIGTERM", "terminated"),  # a runner that prints only the signal's name when the process dies of it
        ("message: Experiment has succeeded because max trial count has reached", "completed"),  # Katib
        ("[ pid ]   uid  tgid total_vm      rss cpu oom_adj oom_score_adj name", "oom"),  # the kernel's OOM table
        ('pod "spark-static-test-exec-1" deleted', "terminated"),  # kubectl delete
        ("distributed.worker - INFO - Stopping worker at tcp://10.0.1.2:43319. Reason: scheduler-close", "completed"),
        ("error: creating server: Internal - failed to load all models", "crashed"),  # Triton
        ("Signal (15) received.", "terminated"),
        ("INFO: Job 2021-01-11_14_31_10-949 finished with status DONE.", "completed"),  # Dataflow
        ("09:56:53.171 | INFO    | Flow run 'cerise-rottweiler' - Finished in state Completed('All states completed.')",
         "completed"),  # Prefect
        ("PASSED[RemoteOpenAIServer] Sent SIGTERM to process 148299", "terminated"),
        ("  SIGSEGV ", "crashed"),
        ("The job has exceeded the maximum execution time of 30m0s", "time-limit"),  # a CI runner's job timeout
        ("Error: Max duration exceeded", "time-limit"),  # dstack
        ("The task was stopped because it exceeded its timeout of 3600 seconds", "time-limit"),
        ("Kernel was shutdown because it exceeded the maximum session time", "time-limit"),
        ("subprocess.TimeoutExpired: Command '['python', 'train.py']' timed out after 7200 seconds", "time-limit"),
        ("CRITICAL Keyboard Interrupt. Ending early.", "interrupted"),
        ("2018-11-06 11:32:27.452292: F tensorflow/core/common_runtime/gpu/gpu_event_mgr.cc:274] Unexpected Event "
         "status: 1", "crashed"),  # a glog FATAL line
        ("pytorchjob-worker-0                 0/1     Error     0          12m", "crashed"),
        ('"message": "Job is being cancelled",', "terminated"),
        ("wandb: Waiting for W&B process to finish... (failed 1). Press Control-C to abort syncing.", "crashed"),
        ("wandb: Program ended successfully.", "completed"),
        ("RuntimeError: Job 1393 failed: Task failed because the node it was running on is dead or unavailable.",
         "preempted"),  # the machine went away without notice (most often a reclaim): not a crash of its own
        ("Error: the spot instance was terminated", "preempted"),
        ("Límite de memoria excedido (29Gi)", "oom"),  # a platform's status in Spanish
        ("RuntimeError: 显存不足", "oom"),  # "not enough GPU memory"
        ("メモリ不足のためプロセスが終了しました", "oom"),
        ("Successfully completed.", "completed"),  # LSF's job report
        # bash's job status in the system's language (glibc's strsignal), and zsh's
        ("[1]+  Beendet                 python train.py", "terminated"),
        ("./run.sh: line 3: 4242 Beendet                 python train.py", "terminated"),
        ("[1]+  Fin de la connexion (raccroché) python train.py", "terminated"),  # a hangup
        ("[1]+  Обрыв терминальной линии python train.py", "terminated"),
        ("[1]+  Abgebrochen             python train.py", "crashed"),  # SIGABRT
        ("[1]+  Speicherzugriffsfehler  python train.py", "crashed"),
        ("[1]+  Getötet                 python train.py", "oom"),  # a bare SIGKILL, as the English 'Killed'
        ("./run.sh: Zeile 3: 12345 Getötet                 python train.py", "oom"),  # "line" in the language too
        ("./run.sh: ligne 3 : 12345 Processus arrêté      python train.py", "oom"),
        ("./run.sh: línea 3: 12345 Terminado (killed)      python train.py", "oom"),
        ("./run.sh: \u0441\u0442\u0440\u043e\u043a\u0430 3: 12345 \u0423\u0431\u0438\u0442\u043e  python x", "oom"),
        ("./run.sh: linha 3: 12345 Morto                   python train.py", "oom"),
        ("./run.sh: riga 3: 12345 Ucciso                  python train.py", "oom"),
        ("[1]+  Unicestwiony            python train.py", "oom"),  # pl
        ("[1]+  Öldürüldü               python train.py", "oom"),  # tr
        ("zsh: terminated  python train.py", "terminated"),
        ("zsh: hangup     python train.py", "terminated"),
        ("python: error while loading shared libraries: libcudart.so.12: cannot open shared object file", "crashed"),
        ("[12345.678] python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0", "oom"),
        ('"reason" : "per-process-limit"', "oom"),  # macOS's jetsam report
        ("Exception Type:  EXC_BAD_ACCESS (SIGSEGV)", "crashed"),  # macOS's crash report
        ("Build timed out (after 60 minutes). Marking the build as aborted.", "time-limit"),  # Jenkins
        ("Cancelling nested steps due to timeout", "time-limit"),
        ('"state": {"life_cycle_state": "TERMINATED", "result_state": "TIMEDOUT"}', "time-limit"),  # Databricks
        ('"state": {"life_cycle_state": "TERMINATED", "result_state": "CANCELED"}', "terminated"),
        ("ERROR: Job failed: canceled", "terminated"),  # GitLab
        ("# Received cancellation signal, interrupting", "terminated"),  # Buildkite
        ("Monitored metric val_loss did not improve in the last 3 records. Best score: 0.412. Signaling Trainer to "
         "stop.", "completed"),  # Lightning's early stopping
        ("2024-05-01 12:00:00 | INFO | fairseq_cli.train | Stopping training due to num_updates: 300000 >= "
         "max_update: 300000", "completed"),
        ("2024-05-01 12:00:00 | INFO | fairseq_cli.train | Stopping training due to cumulative_training_time: 24.01 > "
         "stop_time_hours: 24.0 hour(s)", "time-limit"),
        ("Stopping training because the mean reward 201.35  is above the threshold 200", "completed"),  # SB3
        ("submitit INFO (2024-07-08 17:34:57,477) - Exiting after successful completion", "completed"),
        ("[exiting program at iteration 6000] datetime: 2024-08-25 19:54:10", "completed"),  # Megatron's exit interval
        ("Restoring model weights from the end of the best epoch: 13.", "completed"),  # Keras' early stopping
        ("Loading best model from output/checkpoint-1500 (score: 0.4123).", "completed"),  # the HF Trainer's end
        ("[Rank 0] 2024-05-01 12:00:00,000 INFO fairseq2 - End of training reached at step 10000.", "completed"),
        ("Training time 1 day, 2:03:04", "completed"),  # torchvision's reference scripts
        ("[2024-05-01 12:00:00,000] [INFO] [launch.py:351:main] Process 208585 exits successfully.", "completed"),
        ("2023-07-01 07:35:10,851\tWARNING tune.py:184 -- Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray "
         "Tune run.", "interrupted"),
        ("wandb: Ctrl + C detected. Stopping sweep.", "interrupted"),
        ("Ctrl-C received; terminating training processes.", "interrupted"),  # Composer
        ("Requeued SLURM job: 4812345", "time-limit"),  # Lightning, on Slurm's signal before the limit
        ("I0501 12:00:00.000000 140000000 preemption_watcher.py:110] Preemption signal received.", "preempted"),
        ("Batch 1234: Invalid loss, terminating training", "crashed"),  # Keras' TerminateOnNaN
        ("Divergence threshold reached: val_loss = 12.5 > 10.0. Signaling Trainer to stop.", "crashed"),
        ("[2024-05-01 12:00:00,000] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 208586", "crashed"),
        ("User aborted: stopping task (3)", "terminated"),  # ClearML
        ("WARNING:composer.cli.launcher:Failed to kill global rank 3 (PID 41234) with SIGTERM; terminating with "
         "SIGKILL instead", "killed"),
        ("Device(id:0) memory isn't enough and alloc failed, kernel name: Default/Add-op1", "oom"),  # MindSpore
        ("Container container_1598507699008_0094_01_000010 completed with exit status -102. Diagnostics: Container "
         "preempted by scheduler", "preempted"),  # YARN
        ("BESTEFFORT_KILL: [oar_scheduler] kill the besteffort job 4242", "preempted"),  # OAR
        ("node state: preempted", "preempted"),  # Azure Batch
        ("Task state is updated from RUNNING to FAILED on zones/us-central1-a/instances/1234567890 due to Spot "
         "Preemption with exit code 50001.", "preempted"),  # GCP Batch
        ("SecondaryStatus: Interrupted", "preempted"),  # SageMaker managed spot
        ("Preemption detected, saving checkpoint and exiting", "preempted"),  # NeMo
        ("airflow.exceptions.AirflowTaskTimeout: Timeout, PID: 18312", "time-limit"),
        ("submitit INFO (2024-05-01 12:00:01,000) - Requeued job 4812345 (2 remaining timeouts)", "time-limit"),
        ("05/04/2011 03:36:38|  main|node001|W|job 48.1 exceeded hard wallclock time - initiate terminate method",
         "time-limit"),  # Grid Engine
        ("Step exceeded its deadline", "time-limit"),  # Argo
        ("[exiting program after 690.0159624854724 minutes] datetime: 2024-08-25 19:54:10", "time-limit"),  # Megatron
        ("Container [pid=8788,containerID=container_1_0094_01_000010] is running beyond physical memory limits.",
         "oom"),  # YARN
        ("RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms", "collective-timeout"),
        ("Crash detected! Execution was aborted by an interrupt signal.", "interrupted"),  # Prefect
        ("Crash detected! Execution was aborted by a termination signal.", "terminated"),
        ("009 (244585.000.000) 08/20 13:12:55 Job was aborted by the user.", "terminated"),  # HTCondor's condor_rm
        ("TrainingJobStatus: Stopped, SecondaryStatus: Stopped", "terminated"),  # SageMaker
        ("TrainingJobStatus: Completed, SecondaryStatus: Completed", "completed"),
        ("\t(1) Normal termination (return value 0)", "completed"),  # HTCondor
        ("\t(1) Normal termination (return value 1)", "crashed"),
        ("Normal  DisruptionTerminating  nodeclaim/default-abc12  Disrupting NodeClaim: Underutilized", "terminated"),
        ("slurmstepd: error: *** STEP 4812345.0 ON gpu-node017 FAILED (non-zero exit code or other failure mode) ***",
         "crashed"),
        ("4812345|train|TIMEOUT|1:0", "time-limit"),  # sacct -P
        ("4812345|train|FAILED|1:0", "crashed"),
        ("Exiting because a job execution failed. Look above for error message", "crashed"),  # Snakemake
        ("Reason: ReachedMaxRestarts  Message: jobset failed due to reaching max number of restarts", "crashed"),
        ("PyTorchJob bert-ddp is failed because 1 Worker replica(s) failed.", "crashed"),  # Kubeflow
        ("RuntimeError: Application timeout caused pair closure", "collective-timeout"),  # Gloo
        ("ProcessGroup watchdog hang due to timeout", "collective-timeout"),
        ("Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618 (most recent "
         "call first):", "collective-timeout"),  # the NCCL watchdog's abort, in c10's words
        ("WARNING - State of this instance has been externally set to success. Terminating instance.", "completed"),
        ("[01/02 03:04:06 d2.engine.hooks]: Overall training speed: 89998 iterations in 5:12:30 (0.2083 s / it)",
         "completed"),  # detectron2's last words
        ("2024-01-01 00:00:00,000 (trainer:338) INFO: The training was finished at 100 epochs", "completed"),  # ESPnet
        ("Container killed on request. Exit code is 143", "terminated"),  # YARN
        ("Warning  BackoffLimitExceeded  2m  job-controller  Job has reached the specified backoff limit", "crashed"),
        ("celery.exceptions.TimeLimitExceeded: TimeLimitExceeded(300,)", "time-limit"),
        ("[2024-01-01 00:00:00,000: ERROR/MainProcess] Hard time limit (300s) exceeded for tasks.train[abc]",
         "time-limit"),
        ("billiard.exceptions.WorkerLostError: Worker exited prematurely: signal 9 (SIGKILL) Job: 3.", "oom"),
        ("trainer.service: State 'stop-sigterm' timed out. Killing.", "killed"),  # systemd's grace period ran out
        ("trainer.service: Service reached runtime time limit. Stopping.", "time-limit"),  # systemd's RuntimeMaxSec
        ("Kernel Restarting: The kernel appears to have died. It will restart automatically.", "oom"),  # a hint
        ("job.exception type=timeout severity=0 resource allocation expired", "time-limit"),  # Flux
        ("Job was held. Job has gone over cgroup memory limit of 2048 megabytes. Peak usage: 2100 megabytes.", "oom"),
        ("2020-09-11 18:05:07,660-INFO: Save model to output/huaxue_1/model_final.", "completed"),  # the last save
        ("distributed.nanny - WARNING - Worker exceeded 95% memory budget. Restarting", "oom"),  # Dask
        ("Out of memory error on GPU 0. Cannot allocate 18.062744MB memory on GPU 0", "oom"),  # Paddle
        ("Workload evicted, storage limit exceeded (50G)", "terminated"),  # a platform's eviction
        ("  ├-⚠ hybridize(1)               hm-prssb-1650539430  pod deleted", "terminated"),  # Argo
        ("Process 20472 exited with status code: 1", "crashed"),  # Prefect's worker
        ("[2022-01-24, 16:18:18 UTC] {taskinstance.py:1267} INFO - Marking task as SUCCESS. dag_id=d, task_id=t",
         "completed"),  # Airflow
        ('    "statusReason": "PREEMPTION_IN_PROGRESS: Cross-share preemption triggered to reclaim borrowed capacity",',
         "preempted"),  # AWS Batch
        ("✓ Job finished (status: FAILED).", "crashed"),  # SkyPilot: the user's program failed
        ("I 03-26 01:30:39 controller.py:311] The user job failed JobStatus.FAILED. Please check the logs below.",
         "crashed"),
        ("=   EXIT CODE: 9", "oom"),  # MPICH's banner: the rank died of SIGKILL
        ("=   EXIT CODE: 1", "crashed"),
        ("INFO:tensorflow:ShutdownHook: lame workers found: HeartbeatManager(/job:worker/replica:0/task:0)",
         "preempted"),  # a TPU worker stopped answering
        ("  - message: 'GCPControllerManager: node no longer exists'", "preempted"),
        ("Check instance blue-elephant-0 status. shim health: SSH or tunnel error", "preempted"),  # dstack
        ("Server.SpotInstanceTermination: Spot instance termination", "preempted"),
        ("Job state: PREEMPTED", "preempted"),
        ("slurmstepd: error: *** JOB 12 STEPD TERMINATED ON n1 AT 2024-01-01T00:00:00 DUE TO JOB NOT ENDING WITH "
         "SIGNALS ***", "killed"),
        ("Your notebook tried to allocate more memory than is available. It has restarted.", "oom"),
        ("  Warning  BackOff  1m  kubelet  Back-off restarting failed container trainer in pod t-0", "crashed"),
        ("ray.exceptions.RayTaskError(ValueError): ray::train() (pid=1, ip=10.0.0.4)", "crashed"),
        ("Node is shutting down, evicting pods", "terminated"),  # graceful node shutdown: spot only if said
        ("State: TIMEOUT (exit code 0)", "time-limit"),  # seff: the job's state, not its exit code, says how
        ("State: CANCELLED (exit code 0)", "terminated"),
        ("State: PREEMPTED (exit code 0)", "preempted"),
        ("UncompletedJobError: Job 42 (task: 0) with path /p/42_0_result.pkl has not produced any output (state: "
         "TIMEOUT)", "time-limit"),
        ("4242            train    gpu       acct      8 OUT_OF_ME+    0:125", "oom"),  # sacct's cut column
        ("submitit INFO (2021-04-01 02:26:27,643) - Job has not timed out. Ran 61 minutes out of requested 120 "
         "minutes.", "preempted"),
        ("slurmstepd: error: *** JOB 42 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO JOB REQUEUE ***", "preempted"),
        ("numpy.core._exceptions._ArrayMemoryError: Unable to allocate 3.00 GiB for an array", "oom"),
        ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "oom"),
        ("ClientError: Training job exceeded MaxRuntimeInSeconds provided", "time-limit"),
        ("The spot instance i-0abc was interrupted", "preempted"),
        ("Spot VM evicted by Azure", "preempted"),
        ("The replica master 0 ran out-of-memory and exited with a non-zero status of 247.", "oom"),
        ("E xla_util.cc:88] RESOURCE_EXHAUSTED: Attempting to reserve 6.48G at the bottom of memory.", "oom"),
        ("ERROR    You do not have enough GPU memory available to train the selected model", "oom"),
        ("ERROR: Job failed: execution took longer than 1h0m0s seconds", "time-limit"),
        ("t-0   ml   Evicted   node-9   Pod The node had condition: [DiskPressure].", "terminated"),
        ("Killed: 9", "oom"),  # macOS's shell
        ("229/230 [============================>.] - ETA: 2s - loss: 0.2038 - acc: 0.9209Killed", "oom"),
        ("forrtl: error (200): program aborting due to control-C event", "interrupted"),  # Intel's runtime, Windows
        ("terminate called after throwing an instance of 'gloo::TimeoutException'", "collective-timeout"),
        ("W0922 14:15:28.519321  4997 init.cc:234] *** SIGSEGV (@0x0) received by PID 4796 (TID 0x7f2d) from PID 0; "
         "stack trace: ***", "crashed"),  # glog's failure-signal handler (Paddle, TensorFlow)
        ("Stopping training early as no improvement observed in last 100 epochs.", "completed"),
        ("Epoch 00042: early stopping", "completed"),  # Keras
        ("[ignite.engine.engine.Engine][INFO] - Engine run complete. Time taken: 00:01:45.348", "completed"),
        (" validation results at the end of training for val data | lm_loss value: 2.53E+00 |", "completed"),
        ("ERROR: InterruptException:", "interrupted"),  # Julia's Ctrl-C
        ("job 3132467 exceeded MEM usage hard limit (2528 > 1126)", "oom"),  # PBS
        ("Container rank 0 status failed cmd ['python', '-u', 'train.py'] code 1 log log/workerlog.0", "crashed"),
        ("(autoscaler +44m27s) Instance k-1a5e (node IP: 10.1.140.199) will be terminated soon (reason: "
         "kubernetes-pod-termination).", "preempted"),
        ("Execution halted", "crashed"),  # R, after its own error
        ("EXITING because of FATAL PARAMETER ERROR: limitGenomeGenerateRAM=31000000000is too small", "crashed"),
        ("  Process exceeded running time limit (8h)", "time-limit"),  # Nextflow
        ("killed;", "oom"),
        ("Your runtime has been disconnected due to executing code that is disallowed in our free of charge tier.",
         "terminated"),
        # gloo's timeout is a collective's, in whichever thread it surfaced
        ("RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:72] Timed out waiting 1800000ms for recv operation to "
         "complete", "collective-timeout"),
        # issue 55, fourth round: what a blind reader read right and the rules did not
        ("RuntimeError: ", "crashed"),  # an exception's name alone, its message on the lines after
        ("BLAS : Program is Terminated. Because you tried to allocate too many memory regions.", "crashed"),
        ("slurmstepd: error: Exceeded step memory limit at some point.", "oom"),
        ("Refer to the documentation on how to address the out of memory issue: "
         "https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html.", "oom"),
        ("  Process `spikesort` terminated with an error exit status (140)", "time-limit"),  # SIGUSR2: Grid Engine's
        ("*** SIGTERM (@0xe) received by PID 134 (TID 0x7f0c2b50c700) from PID 14; stack trace: ***", "terminated"),
        ("Processing EC2_INSTANCE_TERMINATE event for instance i-053275a57b3cc9fb4", "terminated"),  # ParallelCluster
        # issue 55, fourth round: fresh4's wordings, after it was scored
        ("FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory", "oom"),
        ("E pjrt_stream_executor_client.cc:1981] Execution of replica 3 failed: Resource exhausted: Failed to allocate "
         "request for 32.00MiB", "oom"),  # XLA on a TPU
        ("bash: line 2: 296230 Killed                  timeout -s KILL 1800 docker run -t --name task", "time-limit"),
        ("[taskcluster:error] Task timeout after 1800 seconds. Force killing container.", "time-limit"),
        ("\"message\": \"Task t.combine:NA:1 failed. The job was stopped before the command finished. PAPI error code "
         "10. The assigned worker has failed to complete the operation\"", "preempted"),  # a VM gone: a reclaim
        ("DEBUG n.c.g.batch.GoogleBatchTaskHandler - [GOOGLE BATCH] Cannot read exit status for task: `run_2 (398)`",
         "preempted"),
        ("-1:MPT ERROR: MPI_COMM_WORLD rank 1151 has terminated without calling MPI_Finalize()", "crashed"),
        ("Tue Jul 30 21:43:41: Completed <exit>; TERM_EXTERNAL_SIGNAL: job killed by a signal", "terminated"),  # LSF
        ("Job 143560526.gadi-pbs killed due to exceeding jobfs quota. Quota: 15.0GB, Used: 15.0GB", "terminated"),
        ("   Exit Status:        271 (Linux Signal 15 SIGTERM Termination)", "terminated"),  # PBS on Gadi
        ("Terminating processes on user request, this might take some time.", "interrupted"),  # Snakemake's Ctrl-C
        ("2023-10-19 12:58:22.060 [1697741901127204/bonus_movie/2 (pid 6592)] <flow PlayListFlow step bonus_movie> "
         "failed:", "crashed"),  # Metaflow
        ("[2025-01-21 17:10:38] Error: Curand error 203 - src/tensors/rand.cpp:74: curandCreateGenerator", "crashed"),
        ("2017-11-12 06:37:27,920 [INFO] - Train model END 189635.83s", "completed"),
        ("2m32s  Normal  Preempted  pod/medium-worker-0  by default/critical-worker-0 on node 192.168.0.23",
         "preempted"),  # a Kubernetes event table
        ("42s  Warning  Evict  pod/pyspark-pi-driver-routine-bf2  Pod is evicted, because of preempt", "preempted"),
        ("Container exited with a non-zero exit code -104. Diagnostics: Container killed", "oom"),  # YARN
        ("Exit status: -102. Diagnostics: Container preempted", "preempted"),  # YARN
        ("Task timed out after 900.05 seconds", "time-limit"),  # AWS Lambda
        ("statusReason: Job attempt duration exceeded timeout", "time-limit"),  # AWS Batch
        ("Job exceeded its walltime and was terminated", "time-limit"),
        ("Execution halted because the job exceeded the maximum allowed run time", "time-limit"),
        ("Task state is updated from RUNNING to FAILED on zones/us-central1-a/instances/x due to task timeout with "
         "exit code 50005.", "time-limit"),  # Google Batch
        ("Task state is updated from RUNNING to FAILED on zones/us-central1-a/instances/x due to Spot VM preemption "
         "with exit code 50001.", "preempted"),  # Google Batch
        ('Job 1234 exceeds job hard limit "h_vmem" of queue "all.q@node1"', "oom"),  # Grid Engine
        ('Job 1234 exceeds job hard limit "h_rt" of queue "all.q@node1"', "time-limit"),  # Grid Engine
        ("Aborted by admin", "terminated"),
        ("009 (123.000.000) Job was aborted. via condor_rm (by user alice)", "terminated"),  # HTCondor
        ("State of this instance has been externally set to failed. Terminating instance.", "terminated"),  # Airflow
        ("The runner has received a shutdown signal. This can happen when the runner service is stopped", "terminated"),
        ("Normal  TaintManagerEviction  pod/train-0  Marking for deletion Pod default/train-0", "terminated"),
        ("{local_task_job.py:154} INFO - Task exited with return code Negsignal.SIGKILL", "oom"),  # Airflow
        ("Container marked as failed: container_1 on host: ip-10-0-0-1. Exit status: -100. Diagnostics: Container "
         "released on a *lost* node.", "preempted"),  # YARN: a machine gone without notice (weak)
        ("Warning  NodeNotReady  pod/train-0  Node is not ready", "preempted"),  # (weak: a machine gone)
        ("srun: error: Node failure on n12", "killed"),  # (as Slurm's NODE_FAIL)
        ("Normal  Killing  pod/train-0  Container main failed liveness probe, will be restarted", "terminated"),
        ("Warning  Unhealthy  pod/train-0  Liveness probe failed: HTTP probe failed with statuscode 500", "terminated"),
        ("zsh: interrupt  python train.py", "interrupted"),
        ("Job was held. The job exceeded allowed execution duration of 3600 seconds", "time-limit"),
        ("ClientError: Please use an instance type with more memory, or reduce the size of job data", "oom"),
        ("fatal error: runtime: out of memory", "oom"),  # Go
        ("MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD with errorcode 1.", "crashed"),
        ("The training job has completed successfully.", "completed"),
        ("Reporting training SUCCESS", "completed"),  # SageMaker's training toolkit
        ("[E ProcessGroupGloo.cpp:138] Rank 0 successfully reached monitoredBarrier, but received errors while waiting "
         "for send/recv from rank 1.", "collective-timeout"),
        ("Your instance is scheduled to be terminated: capacity was reclaimed", "preempted"),
        ("Preemption notice received", "preempted"),
        ("2023/09/29 09:11:12 llama.go:320: llama runner exited with error: signal: illegal instruction", "crashed"),
        ("runner exited with error: signal: killed", "oom"),  # Go's os/exec
        ("Signal Received: 15 (Terminated)", "terminated"),
        ("Apr-08 00:39:30.102 [SIGINT handler] DEBUG nextflow.Session - Session aborted -- Cause: SIGINT",
         "interrupted"),
        ("systemd[1]: snap.gemma3.server.service: State 'final-sigterm' timed out. Killing.", "killed"),
        ("under_oom detected for 5 seconds. Cache usage 21749760 less than minimum 429496725, re-enabling OOM killer",
         "oom"),
        ("11/06/2019 14:54:53  L    Simulation: preempting job", "preempted"),  # PBS Pro's tracejob
        ("message: SLURM-job '2254' failed, SLURM status is: 'TIMEOUT'.", "time-limit"),  # Snakemake's executor
        ("frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long>>) + 0x1d2",
         "collective-timeout"),
        ("Runner failed with exception: Runner has been initializing for too long: 300 seconds", "time-limit"),  # Modal
        ("The job running on agent Azure Pipelines 2 ran longer than the maximum time of 60 minutes. The operation was "
         "canceled.", "time-limit"),  # Azure DevOps
        ("jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: sync0.",
         "collective-timeout"),  # JAX's coordination service
        ("\tthe actor's node was terminated expectedly: received SIGTERM", "terminated"),  # Ray
        ('{"msg":"F0000 00:00:1724426337.414876 4544 loader.cc:55] Check failed: ifstr Cannot open file!"}', "crashed"),
        ("2020-04-15 05:51:54,719 sagemaker-containers INFO Reporting training SUCCESS", "completed"),
        ("2019-12-04 12:48:10,657 - wandb.wandb_agent - INFO - Agent received command: stop", "terminated"),
        ("2022-03-17 00:04:08,196 - ClientRunner - INFO - [run=3]: ABORT (RUN) command received", "terminated"),
        ("WARNING function_runner.py:54 -- Trial detected as completed; re-reporting last result.", "completed"),
        ("torchx 2023-03-07 02:44:57 INFO     Job finished: SUCCEEDED", "completed"),
        ("An internal error has occurred in ORTE:", "crashed"),  # Open MPI
        ("# A fatal error has been detected by the Java Runtime Environment:", "crashed"),
        ("13:27:41.303 | ERROR   | Flow run 'x' - Crash detected! Execution was aborted by Python system exit call.",
         "crashed"),  # Prefect
        ("Aborting task E000027_234A_00035p00o_1: exceeded CPU time limit 298094.146307", "time-limit"),  # BOINC
        ("[2021-05-08 19:48:35,385] {timeout.py:36} ERROR - Process timed out, PID: 10082", "time-limit"),  # Airflow
        ("2005-06-08 20:56:24 [ProteinPredictorAtHome] Unrecoverable error (aborted via GUI RPC)", "interrupted"),
        ("         diagnostics: Shutdown hook called before final status was reported.", "completed"),  # YARN
        ("Terminated: 9", "oom"),  # billiard (Celery's pool)
        ("Task myapp.tasks.test [150a75dc] raised unexpected: Terminated(15,)", "terminated"),
        ("[rank0]:[W326 22:36:28.884350096 socket.cpp:489] [c10d] waitForInput: socket SocketImpl(fd=60) timed out "
         "after 300000ms", "collective-timeout"),
        ("2025-05-16 15:38:42,011 - root - INFO - [EXIT HANDLER] Job timed out, saving checkpoint.", "time-limit"),
        ("2025-05-16 15:41:59,888 - root - INFO - [EXIT HANDLER] Error during training encountered, saving checkpoint.",
         "crashed"),
        ("A remote actor call has failed.", "crashed"),  # Monarch
        ("2024-04-14T22:05:23.8605906Z Killed", "oom"),  # GitHub Actions' timestamp, then the shell's line
        ("@packages/net-stubbing: Killed", "oom"),  # a workspace runner names the package
        ("  Warning  Evicted    12m   kubelet  Pod ephemeral local storage usage exceeds the total limit of containers "
         "1Gi.", "terminated"),  # kubectl describe's events
        ('06:59:26  runner: initiating hard shutdown signal="SIGTERM"', "terminated"),  # a structured log's field
        ("Sent interrupt. Waiting 5s before force killing", "terminated"),  # Nomad stops the task
        ("Gracefully stopping... (press Ctrl+C again to force)", "interrupted"),  # Docker Compose
        ("Too long with no output (exceeded 10m0s): context deadline exceeded", "time-limit"),  # CircleCI
        ("No output has been received in the last 10m0s, this potentially indicates a stalled build or something "
         "wrong with the build itself.", "time-limit"),  # Travis CI
        ("Timeout has been exceeded", "time-limit"),  # Jenkins' timeout step
        ('"stoppedReason": "Your Spot Task was interrupted.",', "preempted"),  # ECS / AWS Batch on Fargate Spot
        ("The TPU was preempted", "preempted"),
        ("08:10:53.571  Finished: ABORTED", "terminated"),  # Jenkins, under its timestamper's time
        ("08:10:53.571  Rejected by Peter Persiel", "interrupted"),  # Jenkins' input step, answered no
        ('"bug_type": "298",', "oom"),  # macOS's JetsamEvent report
        ('kernel: load code signature error 2 for file "openfang"', "killed"),  # macOS refuses the signature
        ("Termination Reason: SIGKILL (Code Signature Invalid)", "killed"),  # a macOS crash report's words
        ("kernel: CODE SIGNING: cs_invalid_page(0x104ccc000): p=23225[example] final status 0x23020200, denying page "
         "sending SIGKILL", "killed"),
        # zsh's job lines: "[1]  + PID how-it-ended  command"
        ("[1]  + 22082 terminated  python train.py", "terminated"),
        ("[1]    22082 hangup     python train.py", "terminated"),
        ("[2]  - 311 segmentation fault  ./a.out", "crashed"),
        ("[1]  + 5 interrupt  python train.py", "interrupted"),
        ("[1]    22082 killed     python train.py", "oom"),  # a SIGKILL naming no sender: the OOM killer's most often
        ("[1]    57761 illegal hardware instruction  python", "crashed"),  # zsh: SIGILL (an AVX wheel on Rosetta)
        ("Abort trap: 6", "crashed"),  # macOS bash: SIGABRT
        ("OMP: Error #15: Initializing libomp.dylib, but found libiomp5.dylib already initialized.", "crashed"),
        ("forrtl: error (200): program aborting due to window-CLOSE event", "interrupted"),  # the console closed
        ("forrtl: error (200): program aborting due to logoff event", "terminated"),
        (" 764: [b3359:542858] *** An error occurred in MPI_Waitall", "crashed"),  # Open MPI
        ("-e:1:in 'ARGF.class#gets': Interrupt", "interrupted"),  # Ruby's Ctrl-C
        ("Terminate batch job (Y/N)? ", "interrupted"),  # Windows' cmd after a Ctrl-C
        ("client_loop: send disconnect: Broken pipe", "terminated"),  # the SSH session dropped: SIGHUP
        ("c++: fatal error: Killed signal terminated program cc1plus", "oom"),  # a build's compiler, OOM-killed
        ("memory allocation of 1048576 bytes failed", "oom"),  # Rust's allocator
        ("thread 'main' panicked at src/main.rs:10:5:", "crashed"),  # Rust
        ('Exception in thread "main" java.lang.NullPointerException', "crashed"),
        ('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space', "oom"),
        ("(RayTrainWorker pid=1190) [2026-03-23 12:40:43,142] [INFO] [axolotl.train] Training completed! Saving "
         "trained model to /data/outputs/run-1.", "completed"),
        ("Reached training limit (2 steps). Exiting continuous_training loop.", "completed"),
        ("10 of 10 steps (100%) done", "completed"),  # Snakemake's workflow, every job done
        ("FATAL: While checking container encryption: could not open image", "crashed"),  # Apptainer
        ("ERROR ~ Script compilation failed", "crashed"),  # Nextflow
        ("torch.distributed.DistBackendError: [5] is setting up NCCL communicator and retrieving ncclUniqueId from [0] "
         "via c10d key-value store by key '0', but store->get('0') got error: wait timeout after 300000ms",
         "collective-timeout"),  # rank 0 never got to the communicator's setup
        ("Some of your processes may have been killed by the cgroup out-of-memory handler.", "oom"),  # Slurm, wrapped
        ("Jan 24 01:46:15 sense4 kernel: pid 41663 (sliod), uid 0, was killed: out of swap space", "oom"),  # FreeBSD
        ("> k delete pod max-restarts-worker-0-1-2bn2v", "terminated"),  # kubectl under its usual alias
        ("  Normal  EvictedDueToPodsReadyTimeout  2m5s  kueue-workload-controller  Exceeded the PodsReady timeout "
         "e2e-gsj4m/job-high-67543", "terminated"),
        ('reason="WorkloadEvictedDueToPreempted"', "preempted"),  # Kueue
        ("    reason: MPIJobEvicted", "terminated"),
        ("run : ActionPhase.SUCCEEDED", "completed"),  # Flyte
        ("May 09 16:36:58 host systemd[2186]: tmux-spawn-d006.scope: systemd-oomd killed 1 process(es) in this unit.",
         "oom"),
        ("RuntimeError: Exception occured! file=cuml_allocator.hpp line=109: FAIL: call='cudaMalloc(&ptr, n)'. "
         "Reason:out of memory", "oom"),  # RAPIDS
        ("SOURCE_EXHAUSTED: Failed to allocate request for 625.00MiB (655360000B) on device ordinal 1", "oom"),
        ("OMP: Error #13: Assertion failure at kmp_runtime.cpp(3689).", "crashed"),
        ("[1]    17358 abort      python myfile2.py", "crashed"),  # zsh's job status: SIGABRT
        ("supervised.exceptions.AutoMLException: Stop training after the first fold. The time estimate for training on "
         "all folds is larger than total_time_limit.", "time-limit"),  # mljar
        ("        Ran out of time, early stopping on iteration 3. Best iteration is:", "time-limit"),  # AutoGluon
        ("[flaml.automl.logger: 08-23 07:26:47] {2631} INFO - retrained model: LGBMClassifier(n_estimators=1)",
         "completed"),
        ("08:20:16 Progress on:train 200it/200it rate:3.3s/it elapsed:23:52 postfix:loss=3.1", "completed"),  # Levanter
        ("Message:             Pod was active on the node longer than the specified deadline", "time-limit"),  # Argo
        ("Exit code: 137. Reason: The container could not be located when the pod was terminated", "terminated"),
        ('level=info msg="Updated message  -> Stopped with strategy \'Terminate\'" namespace=argo', "terminated"),
        ("Runtime error: Launch timed out, space was not healthy after 30 min", "time-limit"),  # a Hugging Face Space
        ("This job was terminated because it ran longer than the maximum allowed job run time.", "time-limit"),
        ("    Total hbm usage >= 9.50G:", "oom"),  # XLA's report of what did not fit in HBM
        ("[2024-08-26 06:20:26 +0000] [22] [ERROR] Worker (pid:25) was sent SIGKILL! Perhaps out of memory?", "oom"),
        ("Memory usage on this node: 7.4/7.5 GiB: ***LOW MEMORY*** less than 10% of the memory on this node is "
         "available for use.", "oom"),  # Ray Tune's status: a hint, when nothing else is said
        ("2020-08-24 06:17:41.069 Workflow failed.", "crashed"),  # Metaflow
        ("13:10:12.582 | ERROR   | Task run 'some_task-0' - Crash detected! Execution was cancelled by the runtime "
         "environment.", "terminated"),  # Prefect's cancellation
        ('  "messageKind": "spot_interrupted",', "preempted"),  # Karpenter's interruption controller
        ("I1215 12:28:18.432174 1 job_controller.go:356] Try to handle request <Queue: , Job: default/vjtest, "
         "Task:task0, Pod:vjtest-task0-1, Event:PodEvicted, ExitCode:0, Action:, JobVersion: 0>", "terminated"),
        ("I1011 18:34:02.960310 1 scale_down.go:790] ip-172-16-207-18.ec2.internal was unneeded for 31.06s",
         "terminated"),  # the cluster autoscaler: a hint, when nothing else is said
    ],
)  # fmt: skip
def test_signals_exits_and_ends_in_plain_words(line: str, verdict: str) -> None:
    assert _verdict(line) == verdict, diagnose([("log", [line])]).render()


def test_a_sigkill_a_launcher_reports_names_no_sender_so_its_verdict_is_not_confident() -> None:
    root_cause = diagnose([("torchrun", ["  rank      : 0 (local_rank: 0)", "  exitcode  : -9 (pid: 1234)",
                                         "  traceback : Signal 9 (SIGKILL) received by PID 1234"])])  # fmt: skip
    # the OOM killer, a grace period or kill -9: the launcher cannot tell; read, like the shell's "Killed", as the
    # OOM killer's (where the threads found the sender, most often it was), and no surer
    assert (root_cause.verdict, root_cause.competing) == ("oom", "killed")
    assert root_cause.confidence == CONFIDENCE["weak, killed"] < 0.8
    assert "OOM killer" in root_cause.summary and "dmesg" in root_cause.deciding
    assert root_cause.fix[0].startswith("host memory")  # (a GPU's memory running out raises; it sends no SIGKILL)
    named = diagnose([("systemd", ["trainer.service: State 'stop-sigterm' timed out. Killing."])])
    assert (named.verdict, named.competing) == ("killed", "oom")  # a sender named: a grace period that ran out


def test_a_requeue_the_job_asked_for_at_its_time_limit_warning_is_the_time_limit() -> None:
    requeue = "slurmstepd: error: *** JOB 31182239 ON sh-06-34 CANCELLED AT 2018-11-05T10:35:06 DUE TO JOB REQUEUE ***"
    assert _verdict("step 10", requeue) == "preempted"  # alone: most often a preemption in requeue mode
    warned = ("Mon Nov  5 10:34:59 PST 2018: Job 31182239 received SIGUSR1, re-queueing", requeue)
    assert _verdict(*warned) == "time-limit"  # its --signal=USR1@N warning came first: its own handler requeued it
    assert _verdict(*reversed(warned)) == "preempted"  # (the warning after the requeue is the next run's)
    assert _verdict("Training completed or interrupted") != "completed"  # (a line that does not know which)


@pytest.mark.parametrize(
    "line",
    [
        "The cluster may be preempted or failed; recovering",  # a wrapper's guess about a healthy node
        "Registering a signal handler for SIGTERM",
        "if the job is preempted it will be requeued",
        "Epoch 1/5: 100%|██████████| 49/49 [21:57<00:00, 26.90s/img]",  # an epoch's bar, not the run's
        "Loading checkpoint shards: 100%|██████████| 4/4 [00:15<00:00]",
        "Time limit exceeded... Skipping ExtraTreesEntr_BAG_L2.",  # a model's time budget inside the job, not the job's
        "Number of target algorithms that exceeded the time limit: 1",  # auto-sklearn's summary counts its trials
        "Number of target algorithms that exceeded the memory limit: 2",
        "This could be caused by a segmentation fault while calling the function or by an excessive memory",  # joblib
        "[TensorRT] VERBOSE: Graph construction and optimization completed in 1.30692 seconds.",  # a phase, not the run
    ],
)
def test_words_that_only_look_like_an_end_decide_nothing(line: str) -> None:
    assert _verdict(line) == "unknown", diagnose([("log", [line])]).render()


def test_a_cancelled_task_s_error_is_the_cancel_s_consequence_not_the_cause() -> None:
    cancelled = ["Traceback (most recent call last):", '  File "calls.py", line 181, in aresult',
                 "asyncio.exceptions.CancelledError"]  # fmt: skip
    alone = diagnose([("log", cancelled)])
    assert (alone.verdict, alone.confidence) == ("crashed", CONFIDENCE["weak"])  # (when nothing else says why)
    stopped = diagnose([("log", ["INFO | prefect.agent - Found 1 flow runs awaiting cancellation.", *cancelled])])
    assert stopped.verdict == "terminated", stopped.render()


def test_a_spawned_child_that_lost_its_parent_is_the_parent_s_consequence() -> None:
    child = ["Traceback (most recent call last):", '  File "<string>", line 1, in <module>',
             '  File "/usr/lib/python3.8/multiprocessing/spawn.py", line 116, in spawn_main',
             "    exitcode = _main(fd, parent_sentinel)",
             '  File "/usr/lib/python3.8/multiprocessing/spawn.py", line 126, in _main',
             "    self = reduction.pickle.load(from_parent)",
             "_pickle.UnpicklingError: pickle data was truncated"]  # fmt: skip
    killed = "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL"
    both = diagnose([("log", [killed, *child])])
    assert (both.verdict, both.competing) == ("oom", "killed"), both.render()  # the SIGKILL decides, not the child
    alone = diagnose([("log", child)])
    assert (alone.verdict, alone.confidence) == ("crashed", CONFIDENCE["weak"]), alone.render()


def test_a_pod_s_error_status_is_a_hint_a_named_cause_outranks() -> None:
    pods = ["mpi-test-2-mpijob-launcher-lv2fx   1/1   CrashLoopBackOff   2   1m",
            "mpirun.real noticed that process rank 1 with PID 39 on node w-1 exited on signal 9 (Killed)."]  # fmt: skip
    assert _verdict(*pods) == "oom"  # (the rank's SIGKILL, read as the OOM killer's)
    assert _verdict(pods[0]) == "crashed"


def test_a_guess_at_an_oom_is_no_evidence_and_a_caught_oom_is_a_hint() -> None:
    guess = diagnose([("log", ["Hint: Exit code 137 typically means the process was running out of memory"])])
    assert not [e for e in guess.evidence if e.verdict == "oom"], guess.render()  # (the 137 itself: a bare SIGKILL)
    assert (guess.verdict, guess.confidence) == ("oom", CONFIDENCE["weak, killed"]), guess.render()
    caught = diagnose([("log", ["WARNING: ran out of memory with exception: CUDA out of memory. Tried to allocate"])])
    assert [(e.verdict, e.strength) for e in caught.evidence] == [("oom", "hint")], caught.render()


def test_a_thread_s_timed_out_collective_still_counts_and_its_other_exceptions_are_hints_it_went_on() -> None:
    head = ["Exception in thread Thread-9:", "Traceback (most recent call last):", '  File "comm.py", line 9, in _recv']
    timeout = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:72] Timed out waiting 1800000ms for recv operation"
    assert _verdict(*head, timeout) == "collective-timeout"
    found = diagnose([("log", [*head, "RuntimeError: queue closed"])]).evidence
    assert [(e.verdict, e.strength) for e in found] == [("completed", "hint")]


def test_an_exit_handler_s_error_even_cut_off_is_the_interpreter_shutting_down() -> None:
    at_exit = [
        "Error in atexit._run_exitfuncs:",
        "Traceback (most recent call last):",
        '  File "torch/utils/data/dataloader.py", line 172, in handler',
        "RuntimeError: DataLoader worker (pid 710) is killed by signal: Terminated.",
    ]
    assert [(e.verdict, e.strength) for e in diagnose([("log", at_exit)]).evidence] == [("completed", "hint")]
    cut = [
        "Exception ignored in: <bound method DataLoaderIter.__del__ of <DataLoaderIter object>>",
        "Traceback (most recent call last):",
        '  File "torch/utils/data/dataloader.py", line 322, in __del__',
    ]
    assert [(e.verdict, e.strength) for e in diagnose([("log", cut)]).evidence] == [("completed", "hint")]
    assert [(e.verdict, e.strength) for e in diagnose([("log", cut[1:])]).evidence] == [("crashed", "hint")]


def test_what_fails_in_an_end_of_training_hook_or_as_queues_close_fails_after_the_run_s_work() -> None:
    hook = [
        "Traceback (most recent call last):",
        '  File "train.py", line 9, in <module>',
        '  File "ultralytics/engine/trainer.py", line 421, in _do_train',
        '  File "ultralytics/utils/callbacks/hub.py", line 70, in on_train_end',
        "ValueError: upload failed: 413 Payload Too Large",
    ]
    assert _verdict(*hook) == "completed"
    assert _verdict(*hook[:3], hook[4]) == "crashed"  # the same error inside the loop is a crash
    ipython = [  # the same in a notebook: IPython's header and frames (path in function(args))
        "ValueError                                Traceback (most recent call last)",
        "<ipython-input-12-09ef5983e46a> in <module>",
        "7 frames",
        "/usr/local/lib/python3.7/dist-packages/ultralytics/hub_logger.py in on_train_end(self, *args, **kwargs)",
        "ValueError: not enough values to unpack (expected 5, got 4)",
    ]
    assert _verdict(*ipython) == "completed"
    assert [e.verdict for e in diagnose([("log", [ipython[0], ipython[1], ipython[4]])]).evidence] == ["crashed"]
    queue = [
        "Exception in thread QueueRunnerThread-fifo_queue-fifo_queue_enqueue:",
        "Traceback (most recent call last):",
        '  File "tensorflow/python/training/queue_runner_impl.py", line 238, in _run',
        "tensorflow.python.framework.errors_impl.CancelledError: Enqueue operation was cancelled",
    ]
    assert _verdict(*queue) == "completed"
    oom = "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor"
    assert _verdict(oom, *queue) == "oom"  # queues closed after another error: that error decides


def test_another_process_s_line_inside_a_traceback_does_not_cut_it() -> None:
    lines = ["Traceback (most recent call last):", "Process actor_6:", '  File "popen_fork.py", line 28, in poll',
             "    pid, sts = os.waitpid(self.pid, flag)", "KeyboardInterrupt"]  # fmt: skip
    found = diagnose([("log", lines)]).evidence
    assert [(e.verdict, e.strength, e.line) for e in found] == [("interrupted", "strong", 5)]


def test_a_colab_policy_stop_is_colab_s_not_a_kubectl_delete() -> None:
    found = diagnose([("log", ["Your runtime has been disconnected due to executing code that is disallowed"])])
    assert found.verdict == "terminated" and {e.platform for e in found.evidence} == {"colab"}


def test_a_traceback_whose_frames_lost_their_indentation_is_still_one_traceback() -> None:
    lines = ["Traceback (most recent call last):", 'File "./tools/test.py", line 262, in <module>', "    main()",
             "AssertionError"]  # fmt: skip
    found = diagnose([("log", lines)]).evidence
    assert [(e.verdict, e.strength, e.line) for e in found] == [("crashed", "strong", 4)]


def test_a_traceback_flattened_onto_one_line_is_read_as_one() -> None:
    """A cloud console's entry or a JSON logger's message holds the whole traceback on one line."""
    head = '2022-11-29 17:00:09.138 PST Traceback (most recent call last): File "main.py", line 66, in <module> '

    def read(line: str) -> list[tuple[str, str]]:
        return [(e.verdict, e.strength) for e in diagnose([("log", ["step 10", line])]).evidence]

    assert read(head + "app.run(main) ValueError: could not broadcast") == [("crashed", "strong")]
    assert read(head + "main() KeyboardInterrupt") == [("interrupted", "strong")]
    assert read(head + "train() torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")[0][0] == "oom"
    # cut off before its exception: what a cut-off traceback is, a hint; a raise in its source line is no exception
    assert read(head + 'app.run(main) File "/x/absl/app.py", line 308,') == [("crashed", "hint")]
    assert read(head + "raise ValueError(msg) File") == [("crashed", "hint")]
    # in a thread other than the main one, as a traceback's would be, a hint
    thread = diagnose([("log", ["Exception in thread Thread-1:", head + "run() OSError: closed"])]).evidence
    assert [(e.verdict, e.strength) for e in thread] == [("completed", "hint")]
    work = ["Exception in thread Thread-4 (__training_thread_function):", head + "train() OSError: closed"]
    assert [(e.verdict, e.strength) for e in diagnose([("log", work)]).evidence] == [("crashed", "strong")]


def test_a_dask_client_s_closed_stream_is_the_lost_peer_s_consequence() -> None:
    """dask-gateway's scheduler pod was OOM-killed (exit 137); the client then raised StreamClosedError and
    CommClosedError: a peer gone, which says nothing of why, so the exit code decides."""
    lines = ["[W 2019-10-07 09:54:22.473 DaskGateway] Cluster b51b stopped unexpectedly: Container stopped with exit "
             "code 137", "StreamClosedError                         Traceback (most recent call last)",
             "StreamClosedError: Stream is closed", "CommClosedError: in <TCP (closed)>: Stream is closed"]  # fmt: skip
    found = diagnose([("client", lines)])
    assert (found.verdict, found.competing) == ("oom", "killed"), found.render()
    assert _verdict(*lines[1:]) == "crashed"  # (with nothing else, the lost peer is what there is)


def test_lsf_s_record_of_a_bkill_explains_the_keyboardinterrupt_it_sent_first() -> None:
    """bkill sends SIGINT, then SIGTERM, then SIGKILL: the Python job's KeyboardInterrupt is the kill's, which LSF's
    report names (TERM_ADMIN, TERM_OWNER); without that record a KeyboardInterrupt is still a user's interrupt."""
    interrupt = ['  File "agent.py", line 60, in remember', "KeyboardInterrupt"]
    report = ["Subject: Job 8578471: <train> in cluster <dcc> Exited", "TERM_ADMIN: job killed by root or an "
              "administrator.", "Exited with exit code 130."]  # fmt: skip
    found = diagnose([("lsf", [*interrupt, *report])])
    assert found.verdict == "terminated" and found.competing == "interrupted", found.render()
    assert not any(f.startswith(("SLURM:", "Kubernetes:")) for f in found.fix + found.confirm)  # (LSF is named)
    assert _verdict(*interrupt, report[0], "Exited with exit code 130.") == "interrupted"


def test_a_ci_runner_s_own_job_succeeded_line_is_the_end_whatever_it_fails_to_report_after() -> None:
    lines = [
        "Job succeeded                                       duration_s=12.65 job=10815 project=3 runner=Vf4CL5e2",
        "ERROR: Appending trace to coordinator... error couldn't execute PATCH against https://gitlab.example.com",
    ]
    assert _verdict(*lines) == "completed"
    assert _verdict("Job succeeded with warnings in 3 of 5 steps") != "completed"  # (not the runner's line)


def test_a_run_at_its_last_step_or_its_normal_exit_is_done_whatever_crashes_in_teardown() -> None:
    free = ["terminate called after throwing an instance of 'c10::Error'", "  what():  Trying to free a pointer"]
    bar = "Train: 100%|██████████| 742/742 [1:50:01<00:00, 10.37s/it]"
    assert _verdict(bar, *free) == "completed"
    assert _verdict("Train:  99%|█████████▉| 741/742 [1:50:01<00:08, 10.37s/it]", *free) == "crashed"
    exit_warning = (
        "[rank0]:[W310 01:07:17.2347 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been "
        "destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application should call "
        "destroy_process_group."
    )
    assert _verdict("Processed prompts: 100%|█| 1/1", exit_warning) == "completed"
    failed = "E0529 07:39:13.791000 10689 api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 10754) of binary: py"
    assert _verdict(exit_warning, failed) == "crashed"  # a worker that then exits 1 did fail
    hung = "slurmstepd: error: *** STEP 42.2 ON n1 CANCELLED AT 2025-12-03T14:53:02 DUE TO TIME LIMIT ***"
    assert _verdict("[after training is done] datetime: 2025-12-03 14:45:03", hung) == "completed"  # a hung teardown
    assert _verdict(hung, "[after training is done] datetime: 2025-12-03 14:45:03") == "time-limit"
    submitit = ["[submitit][INFO] - Job completed successfully", "[submitit][WARNING] - Bypassing signal SIGTERM"]
    assert _verdict(*submitit) == "completed"
    wandb_end = [
        "wandb: Run summary:", "wandb:   loss 5.9", "Exception in thread IntMsgThr:",
        "Traceback (most recent call last):", '  File "threading.py", line 9', "BrokenPipeError: [Errno 32]",
    ]  # fmt: skip
    assert _verdict(*wandb_end) == "completed"


def test_one_task_failing_first_is_the_cause_of_the_step_s_cancellation() -> None:
    lines = [
        "srun: error: gpu-q-3: task 2: Exited with exit code 1",
        "slurmstepd: error: *** STEP 4242.0 ON gpu-q-3 CANCELLED AT 2026-11-30T10:12:01 ***",
        "srun: error: gpu-q-3: tasks 0-1,3: Terminated",
    ]
    assert _verdict(*lines) == "crashed"
    assert _verdict(lines[1], lines[2], lines[0]) == "terminated"  # cancelled first: the exit 1 followed it
    # the others then killed on two nodes: still the failed task's crash, and it is the initiating event
    killed = ["srun: error: gpu-q-3: tasks 0-1: Killed", "srun: error: gpu-q-4: tasks 4-7: Killed"]
    found = diagnose([("log", [lines[0], lines[1], *killed])])
    assert found.verdict == "crashed" and found.initiating is not None and found.initiating.verdict == "crashed"
    # the failed task's own traceback before srun's lines (the usual shape): the same cause, the same first task
    traceback = ["Traceback (most recent call last):", '  File "train.py", line 5, in <module>', "ValueError: rank 2"]
    found = diagnose([("log", [*traceback, lines[0], lines[1], *killed])])
    assert found.verdict == "crashed" and found.initiating is not None
    assert (found.initiating.who, found.initiating.verdict) == ("node gpu-q-3", "crashed")


def test_a_stop_from_outside_on_a_spot_machine_reads_as_the_reclaim() -> None:
    sigterm = "/bin/bash: line 1:    72 Terminated              python train.py"
    assert _verdict(sigterm) == "terminated"
    assert _verdict("node pool: spot instances (g5.xlarge)", sigterm) == "preempted"
    died = "ray.exceptions.ActorDiedError: The actor died because its node has died. Node Id: 5e1f"
    assert _verdict("worker_nodes: {use_spot: true}", died) == "preempted"  # a node gone without notice
    gone = diagnose([("log", [died])])  # anywhere, weakly: a reclaim that gave no notice, else the machine's crash
    assert (gone.verdict, gone.confidence, gone.competing) == ("preempted", CONFIDENCE["weak"], "crashed")
    # a named sender is not a reclaim, spot or not
    assert _verdict("node pool: spot instances", "*** JOB 7 ON n1 CANCELLED AT 2026-11-30T10:12:01 ***") == (
        "terminated"
    )


def test_every_diagnosis_carries_a_confidence_and_the_competing_verdict() -> None:
    named = diagnose([("log", ["slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-11-30T10:12:01 DUE TO "
                                "PREEMPTION ***"])])  # fmt: skip
    assert named.verdict == "preempted" and named.confidence >= 0.8 and named.competing == "terminated"
    bare = diagnose([("log", ["step 10 loss 2.0", "Killed"])])  # the shell's bare SIGKILL: most often the OOM killer
    assert bare.verdict == "oom" and bare.confidence < 0.8 and bare.competing == "killed"
    assert bare.confidence == CONFIDENCE["weak, killed"]
    sent = diagnose([("log", ["step 10 loss 2.0", "worker exited with error code -9"])])  # a tool's SIGKILL: the same
    assert sent.verdict == "oom" and sent.confidence < 0.8 and sent.competing == "killed"
    assert "oom" in sent.deciding.lower() or "dmesg" in sent.deciding
    nothing = diagnose([("log", ["step 10 loss 2.0"])])
    assert nothing.verdict == "unknown" and nothing.competing is not None and nothing.deciding
    assert f"most likely {nothing.competing}" in nothing.render()


def test_the_cli_json_has_the_confidence_the_competing_verdict_and_what_decides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "train.log"
    log.write_text("step 10 loss 2.0\n^C\n")
    assert main(["diagnose", str(log), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "interrupted" and doc["verdict"] in VERDICTS
    assert 0 < doc["confidence"] <= 1 and doc["competing"] in VERDICTS and doc["deciding"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([
    "step 1 loss 2.0", "Killed", "KeyboardInterrupt", "^C", "Training completed", "Terminated", "Segmentation fault",
    "Traceback (most recent call last):", "RuntimeError: boom", "CUDA out of memory", "spot instances",
    "*** JOB 1 ON n CANCELLED AT 2026-01-01T00:00:00 ***", "Exception in thread Thread-1:", "exit code 137",
]), max_size=8), st.sampled_from([None, 0, 1, 130, 137, 143, -9]))  # fmt: skip
def test_confidence_is_one_of_the_calibrated_values_and_the_competing_verdict_is_another(
    lines: list[str], exit_code: int | None
) -> None:
    result = diagnose([("log", lines)], exit_code=exit_code)
    assert result.confidence in CONFIDENCE.values()
    assert result.competing is None or (result.competing in VERDICTS and result.competing != result.verdict)
    assert result.verdict in VERDICTS


def test_a_log_pasted_as_a_markdown_quote_reads_as_the_log() -> None:
    log = [
        "Traceback (most recent call last):",
        '  File "train.py", line 412, in <module>',
        "    train()",
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB",
    ]
    quoted = [f"> {line}" for line in log]
    assert [(e.verdict, e.strength, e.line) for e in diagnose([("log", quoted)]).evidence] == [("oom", "strong", 4)]
    assert _verdict(*quoted) == _verdict(*log) == "oom"
    assert _verdict(">", "> Killed") == "oom"  # (a quote's empty line, then the shell's line)
    airflow_done = [
        "INFO - Command exited with return code 0",
        "INFO - Marking task as SUCCESS. dag_id=d, task_id=t",
        "WARNING - State of this instance has been externally set to success. Terminating instance.",
        "ERROR - Received SIGTERM. Terminating subprocesses.",
    ]
    assert _verdict(*airflow_done) == "completed"  # the SIGTERM came after the task had succeeded


def test_a_timeout_raised_inside_a_collective_is_a_collective_timeout_in_any_words() -> None:
    barrier = [
        "Traceback (most recent call last):",
        '  File "yolov6/utils/torch_utils.py", line 25, in torch_distributed_zero_first',
        "    dist.barrier(device_ids=[local_rank])",
        '  File "/usr/lib/python3.8/site-packages/torch/distributed/distributed_c10d.py", line 2420, in barrier',
        "    work = default_pg.barrier(opts=opts)",
        "RuntimeError: Socket Timeout",
    ]
    assert _verdict(*barrier) == "collective-timeout"
    assert _verdict(*barrier[1:]) == "collective-timeout"  # an excerpt that starts below the traceback's header
    later = diagnose([("log", [*barrier[1:], "step 5", *barrier[1:2], "RuntimeError: Timeout"])]).evidence
    assert [e.verdict for e in later] == ["collective-timeout", "crashed"]  # (the first's collective does not leak)
    assert _verdict(*barrier[:3], barrier[5]) != "collective-timeout"  # the same words outside a collective
    assert _verdict(*barrier[:5], "RuntimeError: CUDA error: an illegal memory access was encountered") == "crashed"
