// Package dataset finds the namespaces that hold a tenant's datasets in the
// gateway's inventory, for the schedulers' integrations (the Slurm hooks,
// the CSI driver): a job names datasets, the gateway admits namespaces.
package dataset
