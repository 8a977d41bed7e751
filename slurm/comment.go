package slurm

import (
	"fmt"
	"strings"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/dataset"
)

// Dataset is one dataset a job asks for, with the access it needs.
type Dataset = dataset.Want

// commentPrefix opens the comment's field that asks for datasets.
const commentPrefix = "nvmegate:"

// maxDatasets bounds a request: a comment is user input.
const maxDatasets = 64

// ParseComment reads the datasets a job's comment asks for: the field
// "nvmegate:NAME[:ro|rw][,NAME[:ro|rw]...]" (ro when no mode is given).
// A comment without that field asks for none (nil, nil): the job does not
// use nvmegate. A malformed field, or two of them, is an error that names
// what is wrong.
func ParseComment(comment string) ([]Dataset, error) {
	var field string
	for _, f := range strings.Fields(comment) {
		if !strings.HasPrefix(f, commentPrefix) {
			continue
		}
		if field != "" {
			return nil, fmt.Errorf("the comment has two %q fields; give every dataset in one", commentPrefix)
		}
		field = f
	}
	if field == "" {
		return nil, nil
	}
	list := strings.TrimPrefix(field, commentPrefix)
	if list == "" {
		return nil, fmt.Errorf("%q names no dataset: want %sNAME[:ro|rw][,NAME...]", field, commentPrefix)
	}
	var out []Dataset
	seen := map[string]bool{}
	for _, item := range strings.Split(list, ",") {
		name, mode, _ := strings.Cut(item, ":")
		switch mode {
		case "":
			mode = nvmegate.ModeReadOnly
		case nvmegate.ModeReadOnly, nvmegate.ModeReadWrite:
		default:
			return nil, fmt.Errorf("dataset %q: mode %q is not ro or rw", name, mode)
		}
		if err := nvmegate.ValidateDatasetName("dataset", name); err != nil {
			return nil, fmt.Errorf("%q: %w", item, err)
		}
		if seen[name] {
			return nil, fmt.Errorf("dataset %q is asked for twice", name)
		}
		seen[name] = true
		out = append(out, Dataset{Name: name, Mode: mode})
		if len(out) > maxDatasets {
			return nil, fmt.Errorf("more than %d datasets asked for", maxDatasets)
		}
	}
	return out, nil
}
