"""Slurm: sbatch on a login node reached over SSH; the job's files live on the cluster's shared file system."""
