// Package slurm reads what Slurm 22.05 gives nvmegate's job hooks: the
// hook's environment (job ID, node hostlist, user, restart count), the
// datasets a job asks for in its --comment, the time limit scontrol
// reports, and the hooks' configuration file. It does no I/O of its own
// beyond running scontrol; cmd/nvmegate's `slurm` verbs call the gateway.
//
// A job asks for datasets with an ordinary sbatch option:
//
//	sbatch --comment 'nvmegate:common-crawl/2026-10,ckpt/llm-7:rw' train.sh
//
// The comment is the one free-form option that reaches PrologSlurmctld
// (--export variables do not; -C and -L must name features and licenses
// slurm.conf defines, and a feature no node has keeps the job pending),
// and `scontrol show job` displays it, so an operator sees what was asked.
// Only its whitespace-separated field that starts with "nvmegate:" is
// read; the rest of the comment is the user's.
package slurm
