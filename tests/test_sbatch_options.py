"""`--sbatch-option` read as sbatch reads it (words, getopt_long's unique prefixes, an argument in the next word):
an option that contradicts the plan cannot pass in another spelling, and each value is one option."""

from __future__ import annotations

import pytest

from launcher.errors import SpecError
from launcher.spec.sbatch_options import SBATCH_LONG_OPTIONS, sbatch_option
from launcher.spec.slurm_request import OWN_OPTIONS, SlurmRequest


def refusal(value: str) -> str:
    with pytest.raises(SpecError) as caught:
        SlurmRequest(sbatch_options=(value,))
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"--sbatch-option {value!r}: "), text
    return text


@pytest.mark.parametrize(("value", "option"), [
    ("--chd=/scratch", "--chdir"), ("--outp=x.log", "--output"), ("--partitio=gpu", "--partition"),
    ("--ntasks-per-n=2", "--ntasks-per-node"), ("--job-n=x", "--job-name"), ("--job=x", "--job-name"),
    ("--accou=a", "--account"), ("--ope=truncate", "--open-mode"), ("--no-r", "--no-requeue"),
    ("--sig=USR1@9", "--signal"),
])
def test_an_abbreviation_of_an_option_ddpctl_sets_is_refused_naming_it(value: str, option: str) -> None:
    text = refusal(value)
    assert f"sbatch reads {value.split('=')[0]} as {option}; ddpctl sets {option} itself" in text, text


@pytest.mark.parametrize("value", ["--nodes 4", "--time 10", "--partition gpu", "--gres gpu:8", "--chdir '/a b'"])
def test_an_option_and_its_value_as_two_words_is_still_that_option(value: str) -> None:
    assert f"ddpctl sets {value.split()[0]} itself" in refusal(value)


@pytest.mark.parametrize("value", ["--mem=1G --nodes=4", "--mem=1G --time=5", "--hold --parsable",
                                   "--mem 1G 2G", "--comment=x extra"])
def test_two_options_in_one_value_are_refused(value: str) -> None:
    assert "give one option per --sbatch-option" in refusal(value)


@pytest.mark.parametrize(("value", "words"), [
    ("--wrap=hostname", "replaces the batch script"), ("--wra=hostname", "replaces the batch script"),
    ("--array=0-3", "several jobs"), ("--arr 0-3", "several jobs"), ("--gpus=8", "GPUs itself"),
    ("--gpus-per-task=1", "GPUs itself"), ("--parsable", "job id"), ("--test-only", "submits nothing"),
    ("--wait", "keeps sbatch from returning"), ("--clusters=other", "cluster"), ("--ntasks-per-gpu=2", "one task"),
])
def test_options_that_make_the_job_something_else_are_not_passed(value: str, words: str) -> None:
    text = refusal(value)
    assert " is not passed on: " in text and words in text, text


@pytest.mark.parametrize(("value", "words"), [
    ("--ex=1", "is ambiguous for sbatch (--exclude, --exclusive, --export"), ("--no=1", "ambiguous"),
    ("--nosuch=1", "sbatch has no option --nosuch"), ("--hold=1", "--hold takes no value"),
    ("--mem", "--mem needs a value"), ("--comment='a b", "an unclosed quote"), ("-N 3", "one long sbatch option"),
    ("--", "one long sbatch option"), ("   ", "one long sbatch option"), ("--mem=1G\n#SBATCH --nodes=9", "one long"),
])
def test_values_sbatch_would_refuse_or_misread_are_refused_here(value: str, words: str) -> None:
    assert words in refusal(value)


@pytest.mark.parametrize("value", ["--mem=64G", "--mem 64G", "--mem-per-cpu=4G", "--hold", "--exclusive",
                                   "--exclusive=user", "--export=ALL", "--nice=5", "--comment='two words'",
                                   "--mail-type=END", "--reservation=r1", "--nodelist=n[1-2]", "--mem-per-g=1G"])
def test_ordinary_options_pass_as_given(value: str) -> None:
    assert SlurmRequest(sbatch_options=(value,)).sbatch_options == (value,)


def test_every_option_ddpctl_sets_is_one_sbatch_knows() -> None:
    """Else an abbreviation of it would not be recognised as it."""
    assert all(option[2:] in SBATCH_LONG_OPTIONS for option in OWN_OPTIONS)
    assert sbatch_option("--mem=1G") == "--mem"  # an exact name wins over the longer ones it begins
    with pytest.raises(SpecError, match="ambiguous"):
        sbatch_option("--nod=4")  # --nodefile, --nodelist, --nodes: sbatch refuses it too
