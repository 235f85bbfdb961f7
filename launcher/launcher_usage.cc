// `launcher --help`: kept apart from the parser so that the flags' rules and their description
// read each on its own.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launcher/launch_flags.h"

namespace braid::launcher {

std::string LauncherUsage() {
  return absl::StrCat(
      "usage: launcher [flags] [--] [ARGS for the program]\n"
      "       launcher [flags] PROGRAM [ARGS for it]      (torchrun's form)\n"
      "\n"
      "Starts P workers on this node (ranks K*P .. K*P+P-1 of N*P) running the training program\n"
      "(//launcher:train) or PROGRAM with ARGS, and watches them: one worker failing stops the\n"
      "job on every node (or restarts it, --max_restarts). Flag names take '-' or '_'\n"
      "(--nproc-per-node); an unknown flag is an error. Before --, the training program's own\n"
      "flags are passed on to it too:\n  --",
      absl::StrJoin(TrainingProgramFlags(), ", --"),
      ".\n"
      "\n"
      "  --nnodes=N | MIN:MAX  nodes in the job (default 1); MIN:MAX: elastic, between MIN and\n"
      "                        MAX nodes, regrouping when nodes leave or join (docs/LAUNCHING.md)\n"
      "  --node_rank=K         this node's index, 0..N-1 (default 0); node 0 serves the store\n"
      "  --nproc_per_node=P    workers per node: a number, auto (one per GPU, else per CPU), gpu\n"
      "                        or cpu (default 1)\n"
      "  --master_addr=A       address of node 0 that every node reaches (default: $MASTER_ADDR,\n"
      "                        else 127.0.0.1: every node on this machine)\n"
      "  --master_port=Q       port of the rendezvous store on node 0 (default: $MASTER_PORT,\n"
      "                        else 29500; a single node picks a free port when none is given)\n"
      "  --rdzv_endpoint=A:Q   the same as --master_addr=A --master_port=Q (torchrun)\n"
      "  --rdzv_backend=B      static or c10d: both mean Braid's own store on node 0\n"
      "  --rdzv_id=ID          the job's id; every launcher of the job must give the same\n"
      "  --standalone          one node, the store on a free port of this machine\n"
      "  --role=NAME           the workers' role (ROLE_NAME; console prefix), default 'default'\n"
      "  --log_dir=D           worker logs D/workerlog.<rank> (default runs/<config>-<time>, in the\n"
      "                        workspace under bazel run); the training program gets it too\n"
      "  --max_restarts=R      restart the whole worker group up to R times on failure (default 0)\n"
      "  --program=PATH        run this executable instead of the training program\n"
      "  --job_token_file=F    read the job token from F (a mounted secret) instead of\n"
      "                        $BRAID_JOB_TOKEN; '-' reads the first line of standard input\n"
      "  --hostfile=F          DeepSpeed's hostfile ('HOST slots=N' lines): start one launcher\n"
      "                        per host, here for the first and over ssh for the others\n"
      "  --include=H[:S,S][@H...] | --exclude=...   only / all but these hosts or slots\n"
      "  --ssh_port=P          the port of the other hosts' sshd (default: ssh's own)\n"
      "  --watch_stdin         stop the job when standard input closes (the hostfile\n"
      "                        launcher's nodes: their ssh connection went away)\n"
      "  --tee=3 | --redirects=3 | --local_ranks_filter=0,1\n"
      "                        which workers' output the console shows (default: rank 0's);\n"
      "                        per local rank: --tee=0:3,1:0\n"
      "  --scheduler=auto|none|slurm|mpi|env   where the rank layout comes from (default auto:\n"
      "                        Slurm, Open MPI or RANK/WORLD_SIZE variables when present)\n"
      "  --connect_timeout_s=S give up reaching the master's store after S s (default 120)\n"
      "  --rdzv_timeout_s=S    give up waiting for every node to check in after S s (default 300)\n"      "  --rdzv_last_call_s=S  elastic: once MIN nodes are in, wait S s more for others (default 30)\n"
      "  --stop_grace_s=S      SIGTERM, then SIGKILL after S s (default 10)\n"
      "  --heartbeat_timeout_s=S  another node's launcher silent this long counts as failed (60)\n"
      "  --tail_lines=L        lines of a failed worker's log to print (default 10)\n"
      "  --dry_run             print what this launcher would start, and exit\n"
      "\n"
      "torchrun's PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR and\n"
      "PET_MASTER_PORT and Kubernetes' JOB_COMPLETION_INDEX stand in for flags not given.\n"
      "Several nodes need the same secret on every node: export BRAID_JOB_TOKEN=$(openssl rand "
      "-hex 32),\nor --job_token_file. See docs/LAUNCHING.md.\n");
}

}  // namespace braid::launcher
